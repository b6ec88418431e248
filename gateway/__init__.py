"""The tenantgate gateway (FastAPI, Entra ID auth, Rego policy, quotas, audit), and the
`tenantgate` command (main.py)."""
