"""Benchmarks and load tests, each with its servers in processes of their own on 127.0.0.1:
`bench` (the matrix), `peers` (Redis and NATS side by side), `soak`, `locust_run` (locust), with
the shared plumbing in `harness` and `rows`. Uses `headwater` and `wire` only, never the server."""
