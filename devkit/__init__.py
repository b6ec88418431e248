"""Development helpers that the tests and the benchmarks both use: servers on loopback ports, a
real redis-server, the failover harness, the oracle checkpoints and reference, the JSON schemas
and redaction samples. Never part of the product (pyproject installs engine and gateway only)."""
