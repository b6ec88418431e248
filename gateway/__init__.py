"""The tenantgate gateway (FastAPI, Entra ID auth, Rego policy). Built by the gateway issue."""
