"""The OpenAI-compatible endpoints, one folder each (router, protocol, service)."""
