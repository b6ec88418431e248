"""OpenAI-compatible upstream deployments and calls for tests, built the way the gateway builds them."""

from __future__ import annotations

from gateway.deployments.base import UpstreamCall
from gateway.deployments.config import Deployment
from tests.utils.envelopes import envelope

# A streaming caller: the upstream call streams too (tests of whole answers set stream False).
CHAT_BODY = {"model": "served-model", "messages": [{"role": "user", "content": "What is the capital of France?"}],
             "temperature": 0, "stream": True}


def deployment(dialect: str = "vllm", url: str = "http://127.0.0.1:9/v1", **fields) -> Deployment:
    if dialect == "azure-openai":
        fields.setdefault("azure_deployment", "gpt-4o-mini")
    return Deployment(name=f"{dialect}-a", kind="openai", dialect=dialect, url=url, **fields)


def upstream_call(body: dict | None = None, *, route: str = "chat.completions", max_tokens: int = 16,
                  tenant: str = "tenant-a", request_id: str = "chatcmpl-test", **envelope_fields) -> UpstreamCall:
    return UpstreamCall(route=route, body=CHAT_BODY if body is None else body, max_tokens=max_tokens,
                        envelope=envelope(tenant=tenant, **envelope_fields), request_id=request_id, tenant_id=tenant)
