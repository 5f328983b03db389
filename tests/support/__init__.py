"""Helpers shared by the test modules: servers, clusters, etcd, S3, certificates, fault
injection, raw wire peers and the state-machine fuzzer's model."""
