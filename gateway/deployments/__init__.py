"""Deployments: the servers a model runs on (embedded engine, tenantgate engine replicas,
OpenAI-compatible upstreams)."""
