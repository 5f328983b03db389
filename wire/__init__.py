"""The Headwater protocol, sans-I/O: frames, messages, record batches, errors and limits.

Nothing in this package opens a socket, reads a file, logs, or imports asyncio; the asyncio server,
the clients and the Spark job all share it. `frames` cuts a byte stream into frames, `codec` turns
frame bodies into the dataclasses of `messages` and back, `records` handles Kafka RecordBatch v2,
`errors` holds the error codes and the exception hierarchy, `limits` every bound with its reason.
"""
