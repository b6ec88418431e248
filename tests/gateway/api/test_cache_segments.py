"""A platform system prompt published as a public segment: its whole blocks are shared between the
tenants the policy gives it to, over real HTTP with the openai SDK; the rest of each prompt is not.
The audit record says which segment was used and how many tokens were public."""

from __future__ import annotations

import json
from pathlib import Path

from engine import segment_digest
from gateway.cache.segment import segment_tokens
from tests.gateway.api.conftest import ALPHA, IOTA, THETA

SEGMENTS = json.loads((Path(__file__).parent / "data" / "platform_segments.json").read_text())["platform_segments"]
SYSTEM = {"role": "system", "content": "You are the platform's assistant. Answer in plain words, keep every figure "
                                       "the user gives you exactly as written, and say so when you do not know."}
QUESTION = {"role": "user", "content": "What did the board decide about the Lisbon office lease in the March minutes?"}


def _ask(gateway, tenant: str, messages: list[dict]):
    reply = gateway.client(tenant).chat.completions.create(model="demo", messages=messages, max_tokens=1,
                                                           temperature=0)
    return reply, gateway.audit_record(reply.id)


def test_the_policy_datas_digest_is_the_one_the_cli_prints_for_the_demo_models_rendering(gateway) -> None:
    ids = segment_tokens(gateway.engine.tokenizer, [SYSTEM])
    assert (segment_digest(ids).hex(), len(ids)) == (SEGMENTS["assistant"]["digest"], SEGMENTS["assistant"]["tokens"])


def test_two_tenants_share_the_public_blocks_and_nothing_after_them(gateway) -> None:
    public_tokens = SEGMENTS["assistant"]["tokens"] // 16 * 16
    _, first = _ask(gateway, ALPHA, [SYSTEM, QUESTION])
    reply, second = _ask(gateway, THETA, [SYSTEM, QUESTION])  # the very same prompt, another tenant
    for record in (first, second):
        assert record["engine"]["public_segment"] == SEGMENTS["assistant"]["digest"]
        assert record["engine"]["public_tokens"] == public_tokens
    # Theta read Alpha's public blocks, and only those, though its whole prompt was Alpha's too.
    assert second["engine"]["cached_tokens"] == public_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == public_tokens
    # Alpha again: its own blocks past the segment are still its own.
    _, again = _ask(gateway, ALPHA, [SYSTEM, QUESTION])
    assert again["engine"]["cached_tokens"] > public_tokens


def test_a_prompt_that_does_not_start_with_the_segment_is_all_private(gateway) -> None:
    other = {"role": "system", "content": SYSTEM["content"].replace("plain words", "short words")}
    _, record = _ask(gateway, ALPHA, [other, QUESTION])
    assert record["engine"]["public_segment"] == "" and record["engine"]["public_tokens"] == 0


def test_a_tenant_not_given_the_segment_shares_nothing(gateway) -> None:
    _ask(gateway, ALPHA, [SYSTEM, QUESTION])
    # Iota (tenant scope, demo allowed) has no segment in its policy: the same prompt, nothing read.
    _, record = _ask(gateway, IOTA, [SYSTEM, QUESTION])
    assert record["engine"]["public_segment"] == "" and record["engine"]["cached_tokens"] == 0
