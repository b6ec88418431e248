"""Schema compilation bounded in time and shared only within a namespace: a schema whose compile
would run for minutes is refused at the bound (its child process killed), a compiled schema is
reused within its cache namespace and never across, and the compile workers are shared fairly:
one tenant holds at most one, and waiting tenants take turns."""

from __future__ import annotations

import json
import threading
import time

import pytest

from devkit.schemas import SCHEMAS, expensive_schema
from engine.config import ModelConfig
from engine.errors import RequestError
from engine.fair_executor import FairExecutor
from engine.grammar import Grammars
from engine.tokenizer import Tokenizer
from tests.utils.envelopes import envelope

TIMEOUT_S = 1.0
FLAG = json.dumps(SCHEMAS["flag"])


@pytest.fixture(scope="module")
def grammars(demo_model_dir) -> Grammars:
    config = ModelConfig.from_dir(demo_model_dir)
    return Grammars(Tokenizer.from_dir(demo_model_dir), config.vocab_size, config.eos_token_ids[0],
                    compile_timeout_s=TIMEOUT_S)


def test_a_schema_that_compiles_for_minutes_is_refused_at_the_bound(grammars) -> None:
    grammars.compile(FLAG, envelope("warm-up"))  # the probe child starts once; the bound counts compiling only
    started = time.monotonic()
    with pytest.raises(RequestError) as caught:
        grammars.compile(json.dumps(expensive_schema()), envelope("attacker"))
    elapsed = time.monotonic() - started
    assert caught.value.param == "response_format" and caught.value.code == "invalid_json_schema"
    assert f"takes more than {TIMEOUT_S:g} s to compile" in str(caught.value)
    assert elapsed < TIMEOUT_S + 5  # standalone its compile takes minutes
    # The worker that ran it was killed: the next schema gets a fresh one and compiles.
    assert grammars.compile(FLAG, envelope("victim")) is not None


def test_a_refused_schema_sent_again_is_refused_at_once(grammars) -> None:
    schema = json.dumps(expensive_schema(8192))
    with pytest.raises(RequestError):
        grammars.compile(schema, envelope("repeater"))
    started = time.monotonic()
    with pytest.raises(RequestError, match="takes more than"):
        grammars.compile(schema, envelope("repeater"))
    assert time.monotonic() - started < TIMEOUT_S / 2


def test_a_compiled_schema_is_reused_within_its_namespace_only(grammars) -> None:
    schema = json.dumps(SCHEMAS["person"])
    first = grammars.compile(schema, envelope("tenant-a"))
    assert grammars.compile(schema, envelope("tenant-a")) is first
    assert grammars.compile(schema, envelope("tenant-b")) is not first
    assert grammars.compile(schema, envelope("tenant-a", scope="principal", principal="user-2")) is not first
    # A policy that shares no cache keeps no compiled schema either.
    unshared = envelope("tenant-a", scope="none")
    assert grammars.compile(schema, unshared) is not grammars.compile(schema, unshared)


def test_matchers_of_one_grammar_walk_on_their_own(grammars) -> None:
    template = grammars.compile(json.dumps({"enum": ["ab", "cd"]}), envelope())
    first, second = grammars.matchers(template, 2)
    assert first.consume_tokens(grammars._tokenizer.encode('"ab"', add_special_tokens=False))
    assert first.is_accepting() and not second.is_accepting() and not template.is_accepting()


def blocking_job(log: list, name: str, release: threading.Event):
    def job():
        log.append(name)
        release.wait(10)
        return name
    return job


def test_one_tenant_holds_at_most_one_worker() -> None:
    executor, log, release = FairExecutor(2, 1, "test"), [], threading.Event()
    attacker = [executor.submit("attacker", blocking_job(log, f"a{i}", release)) for i in range(3)]
    victim = executor.submit("victim", blocking_job(log, "v", threading.Event()))
    deadline = time.monotonic() + 5
    while "v" not in log and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log == ["a0", "v"]  # the second worker went to the victim, not to the attacker's queue
    release.set()
    assert [f.result(5) for f in attacker] == ["a0", "a1", "a2"]
    victim.cancel()
    executor.shutdown()


def test_waiting_tenants_take_turns() -> None:
    executor, log, release = FairExecutor(1, 1, "test"), [], threading.Event()
    futures = [executor.submit("a", blocking_job(log, "a0", release))]
    futures += [executor.submit("a", blocking_job(log, f"a{i}", release)) for i in (1, 2)]
    futures += [executor.submit("b", blocking_job(log, "b0", release))]
    release.set()
    for future in futures:
        future.result(5)
    assert log == ["a0", "b0", "a1", "a2"]
    executor.shutdown()


def test_a_job_cancelled_while_it_waits_never_runs() -> None:
    executor, log, release = FairExecutor(1, 1, "test"), [], threading.Event()
    running = executor.submit("a", blocking_job(log, "a0", release))
    waiting = executor.submit("b", blocking_job(log, "b0", release))
    assert waiting.cancel()
    release.set()
    running.result(5)
    executor.submit("c", blocking_job(log, "c0", release)).result(5)
    assert log == ["a0", "c0"]
    executor.shutdown()
