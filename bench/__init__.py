"""Benchmarks: scripts run from the repository root (a package only so import contracts can name it)."""
