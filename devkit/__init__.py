"""Development helpers: what the tests and the benchmarks both use (servers on loopback ports, a
real redis-server, the failover harness, the oracle checkpoints and reference, the JSON schemas
and redaction samples), and the development side of the command line: the local token issuer
(issuer) and `tenantgate token` with the app of `serve --dev` (cli).

Installed with the package, so `make run` works from a checkout; never part of the product
image (the Dockerfile copies engine/ and gateway/ only), and the product imports it in one
place, gateway.main, for those two commands (the import contracts in pyproject.toml)."""
