"""One tenant's schema cannot stall another tenant: while an attacker's schema compiles (one that
the library would take tens of seconds on, within the policy's byte and depth bounds), /healthz and
a victim tenant's requests, with and without a schema of their own, are answered promptly; the
attacker gets a 400 at the compile bound, and nothing is logged as an error."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from devkit.schemas import SCHEMAS, expensive_schema
from tests.gateway.api.conftest import ALPHA, GAMMA

ATTACK = expensive_schema(6144)  # ~590 patternProperties: tens of seconds to compile standalone on the VM
PROMPT = [{"role": "user", "content": "hello"}]
PROMPT_S = 1.5  # generous: each victim answer takes milliseconds on a quiet gateway


def json_schema(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def timed(call) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_a_victim_is_answered_promptly_while_an_attackers_schema_compiles(gateway, caplog) -> None:
    attacker = gateway.client(ALPHA)
    victim = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=gateway.token(GAMMA), max_retries=0,
                           timeout=10)
    gateway.clients.append(victim)
    flag = json_schema("flag", SCHEMAS["flag"])
    victim.chat.completions.create(model="demo", messages=PROMPT, max_tokens=1, response_format=flag)  # warm

    def attack():
        with pytest.raises(openai.BadRequestError) as caught:
            attacker.chat.completions.create(model="demo", messages=PROMPT, max_tokens=2,
                                             response_format=json_schema("attack", ATTACK))
        return caught.value.body

    victim_calls = {
        "healthz": lambda: httpx.get(gateway.base_url + "/healthz", timeout=10).raise_for_status(),
        "chat": lambda: victim.chat.completions.create(model="demo", messages=PROMPT, max_tokens=1),
        "chat with a schema": lambda: victim.chat.completions.create(model="demo", messages=PROMPT, max_tokens=1,
                                                                     response_format=flag),
    }
    latencies: dict[str, list[float]] = {name: [] for name in victim_calls}
    with caplog.at_level(logging.WARNING), ThreadPoolExecutor(1) as pool:
        attack_started = time.monotonic()
        attacked = pool.submit(attack)
        time.sleep(0.3)  # the attacker's schema is compiling
        while not attacked.done() or not latencies["chat"]:
            for name, call in victim_calls.items():
                latencies[name].append(timed(call))
        error = attacked.result()
        attack_s = time.monotonic() - attack_started

    slow = {name: max(values) for name, values in latencies.items() if max(values) > PROMPT_S}
    assert slow == {}, f"victim answers slower than {PROMPT_S} s while the attack ran {attack_s:.1f} s: {slow}"
    assert error["code"] == "invalid_json_schema" and error["param"] == "response_format"
    assert error["message"].startswith("response_format: the JSON schema cannot be enforced: it takes more than")
    assert attack_s < gateway.engine.grammars.compiler.timeout_s + 5
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert not any(r.exc_info for r in caplog.records)
