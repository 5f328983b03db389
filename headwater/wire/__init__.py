"""The Headwater protocol, sans-I/O: frames, messages, record batches, errors and limits.

Nothing in this package opens a socket, reads a file, logs, or imports asyncio; the asyncio server,
the clients and the Spark job all share it. `frames` cuts a byte stream into frames; `protocol`
turns frame bodies into the dataclasses of `messages` and back, through tables built from the API
families in `api`; `session` is a client's side of a connection without the I/O; `keys` the
partitioner, `records` handles Kafka RecordBatch v2 (`markers`: the control batches that end
transactions; `transaction_fold`: each batch's fate, committed, aborted or undecided, from the
markers that follow it) and `compression` its compressed forms under a size cap, `errors` holds
the error codes and the exception hierarchy, `limits` every bound with its reason, `names` the
validation of topic, subscription and consumer names."""
