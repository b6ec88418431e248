"""The request path every protocol shares, free of any wire format:

    prompt ─▶ policy decision ─▶ clamp, envelope, route ─▶ budget ─▶ deployment ─▶ usage, audit

admission.py judges, clamps and reserves; knobs.py is the one Decision → envelope mapping;
execution.py runs an admitted request on its deployments (failover before the first output);
accounting.py settles the budget and writes the audit record. gateway/openai/ only parses
requests into an Ask and renders what comes back.
"""
