"""The decision cache keys on what the policy reads of its input (gateway/policy/reads.py)."""

import copy
import json
import random
from pathlib import Path

import pytest
import regorus

from gateway.policy import evaluator as evaluator_module
from gateway.policy.evaluator import EmbeddedEvaluator
from gateway.policy.loader import ARGUMENTS_ENTRYPOINT, TOOLS_ENTRYPOINT
from gateway.policy.prepared import checked
from gateway.policy.reads import InputReads, describe, engine_reads
from tests.gateway.policy.conftest import POLICY_DIR, SAMPLES


def reads_of(text: str) -> InputReads:
    engine = regorus.Engine()
    engine.add_policy("p.rego", text)
    return engine_reads(engine)


def paths(text: str) -> set[str]:
    return set(describe(reads_of(text)))


def test_dotted_and_bracketed_string_keys_are_static_paths() -> None:
    assert paths('package p\nx if input.request.route == "chat"\ny if input["request"]["model"] == "m"') == {
        "input.request.route", "input.request.model"}


def test_a_computed_or_numeric_index_reads_everything_before_it() -> None:
    assert paths("package p\nx if input.request.messages[_].content == 1\ny if input.a.b[0].c == 1") == {
        "input.request.messages", "input.a.b"}


def test_the_index_expression_itself_is_walked() -> None:
    assert paths("package p\nx := data.tenants[input.principal.tenant_id].limits") == {"input.principal.tenant_id"}


def test_object_get_with_a_literal_key_reads_that_key_alone() -> None:
    assert paths('package p\nx := object.get(input.request, "max_tokens", input.d)\n'
                 'y := object.get(input.r, ["a", "b"], 0)') == {"input.request.max_tokens", "input.d", "input.r.a.b"}


def test_any_other_use_of_a_reference_reads_all_of_it() -> None:
    assert paths("package p\nx := count(input.request)\ny := object.get(input.q, input.k, 0)") == {
        "input.request", "input.q", "input.k"}


def test_a_bare_input_or_an_import_of_it_reads_the_whole_input() -> None:
    whole = reads_of("package p\nx := input")
    assert whole.reads_whole_input and whole.key({"a": 1}) != whole.key({"a": 1, "b": 2})
    assert paths("package p\nimport input.request as r\nx if r.route == 1") == {"input.request"}


def test_with_input_is_not_a_read_of_the_input() -> None:
    assert paths('package p\nx if { y with input as {"a": 1} }\ny if input.a == 1') == {"input.a"}


def test_a_policy_that_reads_the_clock_is_never_cached() -> None:
    reads = reads_of("package p\nx := time.now_ns()")
    assert not reads.cacheable and reads.uncacheable_because == "time.now_ns"
    assert reads_of("package p\nx := time.parse_rfc3339_ns(input.t)").cacheable


def test_the_key_keeps_presence_and_whole_values_where_the_path_ends() -> None:
    reads = reads_of('package p\nx := object.get(input.request, "max_tokens", 0)\ny := input.principal.roles')
    base = {"request": {"max_tokens": 5, "temperature": 0.1}, "principal": {"roles": ["a"], "app_id": "x"}}
    other = copy.deepcopy(base)
    other["request"]["temperature"], other["principal"]["app_id"] = 0.9, "y"
    assert reads.key(base) == reads.key(other)
    for changed in ({"request": {"temperature": 0.1}, "principal": base["principal"]},  # key absent
                    {"request": {"max_tokens": 6}, "principal": base["principal"]},
                    {"request": base["request"], "principal": {"roles": ["a", "b"]}},
                    {"request": "not an object", "principal": base["principal"]},
                    {"request": {"max_tokens": 5.0, "temperature": 0.1}, "principal": base["principal"]}):
        assert reads.key(changed) != reads.key(base)
        assert reads.identity(changed) != reads.identity(base)
    assert reads.identity(base) == reads.identity(other)


# Values that Python calls equal (or that print alike) but JSON, and so the policy, tells apart.
_LOOKALIKES = [1, 1.0, True, "1", None, 0, 0.0, -0.0, False, "", [], ["1"], [1], {}, {"a": 1}, {"a": True},
               ("1",), float("nan"), float("inf"), 10**30, "a\u00e9", ["a", "b"], ["b", "a"], [["a"]]]


def _random_document(rng: random.Random, depth: int = 0) -> dict:
    document: dict = {}
    for key in ("a", "b", "c"):
        if rng.random() < 0.25:
            continue  # absent
        document[key] = (_random_document(rng, depth + 1) if depth < 2 and rng.random() < 0.4
                         else rng.choice(_LOOKALIKES))
    return document


@pytest.mark.parametrize("text", [
    "package p\nx := input.a.b\ny := input.c",
    'package p\nx := object.get(input.a, "c", 0)\ny := input.b.a.c',
    "package p\nx := input",
])
def test_equal_identities_mean_equal_keys(text: str) -> None:
    """identity() is what the cache looks up, key() what is evaluated: two documents may share a cached
    decision only if the policy would read the same JSON in both."""
    reads = reads_of(text)
    rng = random.Random(7)
    documents = [_random_document(rng) for _ in range(3000)]
    by_identity: dict[tuple, str] = {}
    collisions = 0
    for document in documents:
        key = reads.key(document)
        seen = by_identity.setdefault(reads.identity(document), key)
        assert seen == key, document
        collisions += seen is not key
    assert collisions > 100  # documents did meet on an identity, so the check covered shared entries
    # and it splits hardly any key: equal JSON made of other Python types (a tuple for a list) only
    keys = {reads.key(document) for document in documents}
    assert len(by_identity) <= 1.2 * len(keys)


def test_the_shipped_policy_reads_neither_sampling_stream_nor_prompt_length_fields() -> None:
    read = set(describe(EmbeddedEvaluator(POLICY_DIR).reads))
    assert {"input.principal.tenant_id", "input.request.model", "input.request.max_tokens"} <= read
    assert not read & {"input.request.temperature", "input.request.stream", "input.request.n", "input.request",
                       "input.request.prompt_tokens"}  # the context window is the gateway's to apply


def test_a_field_the_policy_does_not_read_hits_the_cache() -> None:
    cached = EmbeddedEvaluator(POLICY_DIR, cache_size=64)
    sample = SAMPLES["allow_standard_app_token"]["input"]
    first = cached.decide(sample)
    warmer = copy.deepcopy(sample)
    warmer["request"]["temperature"], warmer["request"]["stream"] = 1.7, False
    assert cached.decide(warmer) is first
    longer = copy.deepcopy(sample)
    longer["request"]["prompt_tokens"] += 1  # a prompt of another length: chat traffic's every request
    assert cached.decide(longer) is first
    fewer = copy.deepcopy(sample)
    fewer["request"]["max_tokens"] = 7
    assert cached.decide(fewer) is not first


def test_a_rule_that_starts_reading_a_field_makes_it_part_of_the_key(policy_copy: Path) -> None:
    (policy_copy / "limits" / "hot.rego").write_text(
        'package tenantgate.limits\ndeny contains "too hot" if input.request.temperature > 1.5\n')
    cached = EmbeddedEvaluator(policy_copy, cache_size=64)
    assert "input.request.temperature" in set(describe(cached.reads))
    sample = SAMPLES["allow_standard_app_token"]["input"]
    assert cached.decide(sample).allow
    hot = copy.deepcopy(sample)
    hot["request"]["temperature"] = 1.9
    assert cached.decide(hot).reasons == ["too hot"]


def _random_input(rng: random.Random) -> dict:
    """A sample's input with fields drawn from small pools, so many inputs meet on what the policy reads
    while differing in what it does not."""
    document = copy.deepcopy(rng.choice(list(SAMPLES.values()))["input"])
    request, principal = document["request"], document["principal"]
    request["temperature"] = rng.choice([0.0, 0.5, 1.0, 1.3])
    request["stream"] = rng.choice([True, False])
    request["n"] = rng.choice([1, 2])
    request["prompt_tokens"] = rng.choice([10, 8191, 200000, -1])
    choice = rng.choice([None, 256, 0, "x"])
    if choice is None:
        request.pop("max_tokens", None)
    else:
        request["max_tokens"] = choice
    request["route"] = rng.choice(["chat.completions", "completions", "embeddings", request.get("route")])
    request["data_classification"] = rng.choice(["public", "internal", "restricted", "secret"])
    principal["app_id"] = rng.choice(["a", "b"])
    if rng.random() < 0.3:
        principal["tenant_id"] = rng.choice([s["input"]["principal"]["tenant_id"] for s in SAMPLES.values()])
    if rng.random() < 0.2:
        grants = [([], ["Inference.Invoke"]), (["Inference.Invoke.All"], [])]
        principal["roles"], principal["scopes"] = rng.choice(grants)
    document["deployment"]["environment"] = rng.choice(["production", "staging"])
    return document


@pytest.mark.parametrize("seed", [1, 2])
def test_cached_decisions_equal_uncached_ones_over_thousands_of_inputs(seed: int) -> None:
    rng = random.Random(seed)
    cached = EmbeddedEvaluator(POLICY_DIR, cache_size=100_000)
    uncached = EmbeddedEvaluator(POLICY_DIR)
    hits = 0
    for _ in range(2500):
        document = _random_input(rng)
        before = len(cached._cache)
        served = cached.decide(document)
        hits += len(cached._cache) == before
        # The reference: the whole input, evaluated afresh.
        expected = uncached.evaluate(json.loads(json.dumps(document)))
        assert served.model_dump() == expected, document
    assert hits > 500  # the comparison covered hits, not only the misses that fill the cache


# -- what an entrypoint reaches -----------------------------------------------------------------

PACKAGES = {
    "top.rego": "package a\nimport data.a.b\nt := {\"x\": input.top, \"b\": b.r}",
    "b.rego": "package a.b\nr := input.from_b",
    "c.rego": "package a.c\nr := input.from_c\ns := data.a.d.r",
    "d.rego": "package a.d\nr := input.from_d",
    "e.rego": "package e\nr := data.a.c.r",
}


def entry_paths(entrypoint: str, modules: dict[str, str] = PACKAGES) -> set[str]:
    engine = regorus.Engine()
    for name, text in modules.items():
        engine.add_policy(name, text)
    return set(describe(engine_reads(engine, entrypoint)))


def test_an_entrypoint_reads_through_its_package_and_those_it_refers_to() -> None:
    assert entry_paths("data.a.t") == {"input.top", "input.from_b"}  # a's rule t; a imports a.b
    assert entry_paths("data.a.c.r") == {"input.from_c", "input.from_d"}  # c refers to a.d
    assert entry_paths("data.e.r") == {"input.from_c", "input.from_d"}
    assert entry_paths("data.a.b.r") == {"input.from_b"}  # a has no rule b: the package a.b alone


def test_a_reference_to_a_package_above_reaches_everything_under_it() -> None:
    above = {**PACKAGES, "f.rego": "package f\nr := data.a"}
    assert entry_paths("data.f.r", above) == {"input.top", "input.from_b", "input.from_c", "input.from_d"}
    whole = {**PACKAGES, "g.rego": "package g\nr := data[input.k]"}
    assert entry_paths("data.g.r", whole) == {"input.k", "input.top", "input.from_b", "input.from_c",
                                              "input.from_d"}


def test_a_function_of_another_package_is_a_reference_to_it() -> None:
    modules = {"h.rego": "package h\nf(x) := x + input.from_h", "i.rego": "package i\nr := data.h.f(1)"}
    assert entry_paths("data.i.r", modules) == {"input.from_h"}


def test_an_entrypoint_no_package_defines_reads_what_all_of_them_read() -> None:
    assert entry_paths("data.nowhere.r") == entry_paths("data.a.t") | {"input.from_c", "input.from_d"}


def test_the_shipped_tools_decision_reads_no_arguments_and_the_request_decision_no_tools() -> None:
    evaluator = EmbeddedEvaluator(POLICY_DIR)
    tools = set(describe(evaluator.tools_reads))
    assert {"input.tool.name", "input.tool.digest", "input.tool.recorded_digest", "input.server"} <= tools
    assert not any(path.startswith(("input.tool.arguments", "input.request")) for path in tools)
    assert "input.tool" not in tools
    request = describe(evaluator.reads)
    assert not any(path.startswith(("input.tool", "input.server", "input.method")) for path in request)


def test_the_shipped_arguments_package_is_evaluated_on_the_call_and_the_callers_tenant_alone() -> None:
    evaluator = EmbeddedEvaluator(POLICY_DIR)
    assert set(describe(evaluator.arguments_reads)) == {
        "input.method", "input.principal.tenant_id", "input.server", "input.tool.name", "input.tool.arguments"}
    prepared, engine = checked(POLICY_DIR)  # the reload's path carries the same reads
    assert prepared.arguments_reads == evaluator.arguments_reads
    del engine


def test_a_decision_is_evaluated_on_what_its_packages_read(monkeypatch) -> None:
    """regorus is handed the projection (the cache's key), never fields no rule reads."""
    evaluator = EmbeddedEvaluator(POLICY_DIR)
    seen: list[dict] = []
    real = evaluator_module.raw_decision
    monkeypatch.setattr(evaluator_module, "raw_decision",
                        lambda engine, text, *entry: seen.append(json.loads(text)) or real(engine, text, *entry))
    document = copy.deepcopy(SAMPLES["allow_standard_app_token"]["input"])
    document["request"]["temperature"], document["principal"]["uti"] = 0.25, "never read"
    evaluator.decide(document)
    call = {"principal": {"tenant_id": NORTHWIND, "object_id": "o1", "idtyp": "user", "scopes": ["Tools.Invoke"],
                          "roles": []},
            "server": "devtools", "method": "tools/call",
            "tool": {"name": "echo", "digest": DIGESTS[0], "recorded_digest": DIGESTS[0], "arguments": {"text": "a"}}}
    evaluator.decide_tools(call)
    request, tools, arguments = seen
    assert "temperature" not in request["request"] and "uti" not in request["principal"]
    assert "arguments" not in tools["tool"] and "object_id" in tools["principal"]
    assert arguments == {"method": "tools/call", "principal": {"tenant_id": NORTHWIND}, "server": "devtools",
                         "tool": {"name": "echo", "arguments": {"text": "a"}}}


# -- the tools decision, cached ----------------------------------------------------------------

NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"
DIGESTS = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]


def _random_tools_input(rng: random.Random) -> dict:
    principal = {"tenant_id": rng.choice([NORTHWIND, "8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b", "nobody"]),
                 "object_id": rng.choice(["o1", "o2", ""]), "app_id": rng.choice(["a", "b"]),
                 "idtyp": rng.choice(["user", "app", "robot"]),
                 "scopes": rng.choice([["Tools.Invoke"], ["Inference.Invoke"], []]),
                 "roles": rng.choice([[], ["Tools.Invoke.All"]]), "iat": rng.choice([1, 2])}
    if rng.random() < 0.6:  # a caller who may use tools, so that most calls reach their arguments
        principal.update(tenant_id=NORTHWIND, object_id="o1", idtyp="user", scopes=["Tools.Invoke"])
    server = rng.choice(["devtools", "devtools", "elsewhere"])
    if rng.random() < 0.2:
        tools = [{"name": name, "digest": rng.choice(DIGESTS), "recorded_digest": rng.choice(DIGESTS)}
                 for name in rng.sample(["echo", "word_count", "delete_repository", "other"], 3)]
        return {"principal": principal, "server": server, "method": rng.choice(["tools/list", "x/y"]),
                "tools": tools}
    arguments = rng.choice([{}, {"text": "hi"}, {"text": "x" * rng.choice([5, 2000, 2001])}, {"text": 7},
                            {"text": "hi", "path": "/etc"}, {"name": rng.choice(["a", "b"])}])
    tool = {"name": rng.choice(["echo", "word_count", "delete_repository", "other"]),
            "digest": rng.choice(DIGESTS), "recorded_digest": rng.choice(DIGESTS), "arguments": arguments}
    return {"principal": principal, "server": server, "method": "tools/call", "tool": tool}


def _uncached_tools_decision(evaluator: EmbeddedEvaluator, document: dict) -> dict:
    """The reference: both entrypoints evaluated afresh on the whole input, combined as the contract says."""
    decision = evaluator.evaluate(document, TOOLS_ENTRYPOINT)
    if decision["allow"] and document["method"] == "tools/call":
        denials = evaluator.evaluate(document, ARGUMENTS_ENTRYPOINT)
        if denials:
            return {"allow": False, "reasons": sorted(denials), "listed": [],
                    "tool": {"calls_per_minute": 0, "concurrency": 0, "max_result_bytes": 0, "cache": False},
                    "logging": {"content": "none", "redact": ["/arguments", "/result"]}}
    return decision


def test_cached_tools_decisions_equal_uncached_ones_over_thousands_of_inputs() -> None:
    rng = random.Random(3)
    cached = EmbeddedEvaluator(POLICY_DIR, cache_size=100_000)
    uncached = EmbeddedEvaluator(POLICY_DIR)
    hits, denied_by_arguments = 0, 0
    for _ in range(2500):
        document = _random_tools_input(rng)
        before = len(cached._tools_cache)
        served = cached.decide_tools(document)
        hits += len(cached._tools_cache) == before
        expected = _uncached_tools_decision(uncached, json.loads(json.dumps(document)))
        assert served.model_dump() == expected, document
        denied_by_arguments += any(reason.startswith("the argument") for reason in served.reasons)
    assert hits > 1000 and denied_by_arguments > 40, (hits, denied_by_arguments)  # 1203 and 60 with seed 3


def test_a_call_that_differs_only_in_its_arguments_hits_the_tools_cache() -> None:
    cached = EmbeddedEvaluator(POLICY_DIR, cache_size=64)
    call = {"principal": {"tenant_id": NORTHWIND, "object_id": "o1", "idtyp": "user", "scopes": ["Tools.Invoke"],
                          "roles": []},
            "server": "devtools", "method": "tools/call",
            "tool": {"name": "echo", "digest": DIGESTS[0], "recorded_digest": DIGESTS[0], "arguments": {"text": "a"}}}
    first = cached.decide_tools(call)
    other = copy.deepcopy(call)
    other["tool"]["arguments"] = {"text": "b"}
    assert cached.decide_tools(other) is first and len(cached._tools_cache) == 1
    other["tool"]["arguments"] = {"text": "x" * 2001}  # the cached decision, then the arguments' denial
    assert cached.decide_tools(other).reasons == ["the argument text is not allowed by this tenant's policy"]
    other["tool"]["name"] = "word_count"
    assert cached.decide_tools(other) is not first and len(cached._tools_cache) == 2
