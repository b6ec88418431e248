"""n > 1 end to end: the official openai SDK over real HTTP, the demo engine behind it (and the
default model, SmolLM2-135M-Instruct, for the main proof). The choices share the prompt's KV
blocks (the x-record in the audit trail says how many), usage sums their completion tokens over
one prompt, and the budget reserves n x max_tokens."""

from __future__ import annotations

import json

import openai
import pytest

from devkit.server import serving
from engine import EngineConfig, LLMEngine
from gateway.app import create_app
from gateway.inference import EngineBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, DATA_DIR, THETA, gateway_settings

DEFAULT_MODEL = "smollm2-135m-instruct"

# Long enough for several full KV blocks of 16 tokens once the chat template wraps it.
CHAT = [{"role": "user", "content": "Explain, step by step and with care, what a gateway checks before it "
                                    "runs a request for a tenant, and why each of those checks matters."}]


@pytest.fixture
def reservations(gateway, monkeypatch) -> list[int]:
    """The tokens each admission asks the (real, in-process) limiter to reserve."""
    limiter = gateway.state.limiter
    admit = limiter.admit
    seen: list[int] = []

    async def recording(admission):
        seen.append(admission.tokens)
        return await admit(admission)

    monkeypatch.setattr(limiter, "admit", recording)
    return seen


def engine_record(gateway, request_id: str) -> dict:
    (record,) = [r for r in gateway.audit_records() if r["request_id"] == request_id]
    return record


def test_three_choices_share_the_prompts_blocks_and_count_their_tokens(gateway, reservations) -> None:
    completion = gateway.client(ALPHA).chat.completions.create(
        model="demo", messages=CHAT, n=3, max_tokens=8, temperature=1.0, seed=11)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length") for c in completion.choices)
    record = engine_record(gateway, completion.id)
    engine = record["engine"]
    prompt = completion.usage.prompt_tokens
    # The choices held the prompt's full blocks together: computed once, not three times.
    assert engine["choices"] == 3
    assert engine["shared_prefix_blocks"] == (prompt - 1) // gateway.engine.config.block_size >= 2
    assert engine["prompt_tokens"] == prompt
    # Usage: the prompt once, the completion tokens of all three.
    assert completion.usage.completion_tokens == engine["output_tokens"] == record["usage"]["completion_tokens"]
    assert completion.usage.total_tokens == prompt + completion.usage.completion_tokens
    assert engine["finish_reasons"] == [c.finish_reason for c in completion.choices]
    # The budget reserved max_tokens for each choice, the prompt once.
    assert reservations == [prompt + 3 * 8]


def test_seeded_choices_are_reproducible_and_choice_i_is_seed_plus_i(gateway) -> None:
    client = gateway.client(ALPHA)

    def texts(n: int, seed: int) -> list[str]:
        answer = client.chat.completions.create(model="demo", messages=CHAT, n=n, max_tokens=6, temperature=1.0,
                                                seed=seed)
        return [c.message.content for c in answer.choices]

    three = texts(3, 500)
    assert texts(3, 500) == three
    assert [texts(1, 500 + i)[0] for i in range(3)] == three


def test_a_streamed_two_choice_chat_indexes_every_chunk_and_ends_with_usage(gateway, reservations) -> None:
    stream = gateway.client(ALPHA).chat.completions.create(
        model="demo", messages=CHAT, n=2, max_tokens=6, temperature=1.0, seed=3, stream=True,
        stream_options={"include_usage": True})
    content = {0: "", 1: ""}
    roles, finish = set(), {}
    chunks = list(stream)
    for chunk in chunks[:-1]:
        assert chunk.usage is None
        for choice in chunk.choices:
            if choice.delta.role:
                roles.add(choice.index)
            content[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                assert choice.index not in finish
                finish[choice.index] = choice.finish_reason
    assert roles == {0, 1} and set(finish) == {0, 1} and all(content.values())
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    engine = engine_record(gateway, last.id)["engine"]
    assert last.usage.completion_tokens == engine["output_tokens"] and engine["choices"] == 2
    assert engine["finish_reasons"] == [finish[0], finish[1]]
    assert reservations == [last.usage.prompt_tokens + 2 * 6]


def test_completions_give_n_choices_too(gateway) -> None:
    completion = gateway.client(ALPHA).completions.create(
        model="demo", prompt="The policy decides whether a request for a tenant may run on a shared batch, "
                             "and the engine", n=2, max_tokens=5, temperature=1.0, seed=9)
    assert [c.index for c in completion.choices] == [0, 1] and all(c.text for c in completion.choices)
    engine = engine_record(gateway, completion.id)["engine"]
    assert engine["choices"] == 2 and engine["shared_prefix_blocks"] >= 1
    assert completion.usage.completion_tokens == engine["output_tokens"]


def test_a_record_with_content_keeps_each_choice_apart(gateway) -> None:
    # Theta's policy keeps redacted content in its records.
    completion = gateway.client(THETA).chat.completions.create(model="demo", messages=CHAT, n=2, max_tokens=4,
                                                               temperature=1.0, seed=4)
    content = engine_record(gateway, completion.id)["content"]
    assert [c["text"] for c in content["response"]["choices"]] == [c.message.content for c in completion.choices]


def test_n_over_the_tenants_limit_is_a_400_naming_n(gateway) -> None:
    # Alpha's policy data sets no max_choices: policies/limits allows 4.
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client(ALPHA).chat.completions.create(model="demo", messages=CHAT, n=5, max_tokens=2)
    assert caught.value.body["param"] == "n" and caught.value.code == "invalid_value"
    assert "at most 4" in caught.value.body["message"]


@pytest.fixture(scope="module")
def default_model_gateway(local_issuer, smollm2_dir, tmp_path_factory):
    """A gateway serving the default model, Alpha allowed to use it: (base URL, engine, audit file)."""
    root = tmp_path_factory.mktemp("smollm2-gateway")
    tenants = json.loads((DATA_DIR / "tenants.json").read_text())
    tenants["tenants"][ALPHA]["models"].append(DEFAULT_MODEL)
    (root / "data").mkdir()
    (root / "data" / "tenants.json").write_text(json.dumps(tenants))
    engine = LLMEngine(EngineConfig(model=str(smollm2_dir), kv_cache_memory_bytes=64 << 20, max_num_seqs=8,
                                    max_model_len=1024))
    settings = gateway_settings(local_issuer, policy_data_dir=root / "data", served_model_name=DEFAULT_MODEL,
                                metrics_port=0, audit_file=root / "audit.jsonl",
                                audit_signing_key=root / "audit-signing.pem")
    app = create_app(settings, backend=EngineBackend(engine, model_name=DEFAULT_MODEL))
    with serving(app) as base_url:
        yield base_url, engine, settings.audit_file
        app.state.gateway.backend.async_engine.shutdown()


def test_the_default_model_gives_three_choices_over_shared_blocks(default_model_gateway, local_issuer) -> None:
    base_url, engine, audit_file = default_model_gateway
    with openai.OpenAI(base_url=base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                       max_retries=0, timeout=120) as client:
        completion = client.chat.completions.create(model=DEFAULT_MODEL, messages=CHAT, n=3, max_tokens=8,
                                                    temperature=1.0, seed=21)
        stream = list(client.chat.completions.create(model=DEFAULT_MODEL, messages=CHAT, n=2, max_tokens=6,
                                                     temperature=1.0, seed=21, stream=True,
                                                     stream_options={"include_usage": True}))
    assert [c.index for c in completion.choices] == [0, 1, 2] and all(c.message.content for c in completion.choices)
    records = {e["request_id"]: e for e in map(json.loads, audit_file.read_text().splitlines())
               if e["type"] == "record"}
    x = records[completion.id]["engine"]
    prompt = completion.usage.prompt_tokens
    assert x["choices"] == 3 and x["shared_prefix_blocks"] == (prompt - 1) // engine.config.block_size >= 2
    assert completion.usage.completion_tokens == x["output_tokens"]
    # Streamed: the opening names both choices, each ends once, usage comes last.
    finished = [c.index for chunk in stream for c in chunk.choices if c.finish_reason is not None]
    assert sorted(finished) == [0, 1] and stream[-1].choices == []
    assert stream[-1].usage.completion_tokens == records[stream[-1].id]["engine"]["output_tokens"]
