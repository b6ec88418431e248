"""usage.prompt_tokens_details.cached_tokens is no oracle for other tenants' prompts."""

from tests.gateway.api.conftest import ALPHA, GAMMA

PROMPT = [{"role": "user", "content": "Summarise the following meeting notes for the board in three short points, "
                                      "keeping every figure exactly as it was written in the notes."}]


def twice(gateway, tenant: str, **extra):
    client = gateway.client(tenant)
    client.chat.completions.create(model="demo", messages=PROMPT, max_tokens=1, temperature=0, **extra)
    second = client.chat.completions.create(model="demo", messages=PROMPT, max_tokens=1, temperature=0, **extra)
    records = {r.request_id: r for r in gateway.sink.requests}
    return second, records[second.id]


def test_a_tenant_scope_hit_is_reported(gateway):
    reply, record = twice(gateway, ALPHA)
    assert record.cache_scope == "tenant" and record.cached_tokens > 0
    assert reply.usage.prompt_tokens_details.cached_tokens == record.cached_tokens


def test_a_shared_scope_hit_is_not_reported_to_the_caller(gateway):
    # A hit in the shared scope may come from any tenant's prompt; the caller is told 0, the audit keeps it.
    reply, record = twice(gateway, GAMMA, extra_headers={"X-Data-Classification": "public"})
    assert record.cache_scope == "shared" and record.cached_tokens > 0
    assert reply.usage.prompt_tokens_details.cached_tokens == 0
