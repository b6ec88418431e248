"""The request path every endpoint shares, free of HTTP (an import contract keeps it so):

    Ask ─▶ admit(): policy decision, clamp, envelope, route, budget ─▶ Admitted (frozen)
        ─▶ Run: the deployment's outputs, failover before the first ─▶ Run.close(): settle, audit record

admission.py judges, clamps and reserves; envelope.py is the one Decision → envelope mapping;
run.py runs an admitted request on its deployments and settles it, once; exchange.py is what the
pipeline reads of the HTTP request and sets for the response, as values. gateway/openai/ parses
requests into an Ask and renders what a Run yields (responder.py and one renderer per endpoint).
"""
