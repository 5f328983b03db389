"""Load tests and benchmarks: `bench` (end-to-end throughput and latency, server in its own
process), and later the locustfile. Uses `headwater` and `wire` only, on 127.0.0.1."""
