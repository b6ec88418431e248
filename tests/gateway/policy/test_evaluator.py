import json
import shutil
import threading
from pathlib import Path

import pytest

from gateway.policy.evaluator import EmbeddedEvaluator
from gateway.policy.exceptions import PolicyEvaluationError
from tests.gateway.policy.conftest import POLICY_DIR, SAMPLES


@pytest.fixture(scope="module")
def evaluator() -> EmbeddedEvaluator:
    return EmbeddedEvaluator(POLICY_DIR)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_decision_matches_expected(evaluator: EmbeddedEvaluator, name: str) -> None:
    assert evaluator.decide(SAMPLES[name]["input"]).model_dump() == SAMPLES[name]["expected"]


def test_samples_cover_both_outcomes() -> None:
    assert sum(s["expected"]["allow"] for s in SAMPLES.values()) >= 3
    assert sum(not s["expected"]["allow"] for s in SAMPLES.values()) >= 3


def test_cached_decision_is_served_from_cache() -> None:
    cached = EmbeddedEvaluator(POLICY_DIR, cache_size=8)
    sample = SAMPLES["allow_standard_app_token"]["input"]
    first = cached.decide(sample)
    assert cached.decide(json.loads(json.dumps(sample))) is first
    assert cached.decide(SAMPLES["deny_unknown_tenant"]["input"]) is not first


def test_cache_is_bounded() -> None:
    cached = EmbeddedEvaluator(POLICY_DIR, cache_size=2)
    names = ["allow_standard_app_token", "deny_unknown_tenant", "deny_region_not_allowed"]
    first = cached.decide(SAMPLES[names[0]]["input"])
    for name in names[1:]:
        cached.decide(SAMPLES[name]["input"])
    assert cached.decide(SAMPLES[names[0]]["input"]) is not first


def test_revision_is_a_content_digest(tmp_path: Path) -> None:
    copy = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, copy)
    before = EmbeddedEvaluator(copy).revision
    assert before == EmbeddedEvaluator(copy).revision
    tenants = copy / "data" / "tenants.example.json"
    tenants.write_text(tenants.read_text().replace('"priority": 2', '"priority": 3'))
    assert EmbeddedEvaluator(copy).revision != before


def test_one_engine_per_thread_gives_the_same_decisions(evaluator: EmbeddedEvaluator) -> None:
    names = sorted(SAMPLES)
    results: dict[int, list[dict]] = {}

    def work(index: int) -> None:
        results[index] = [evaluator.decide(SAMPLES[n]["input"]).model_dump() for n in names * 5]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [SAMPLES[n]["expected"] for n in names * 5]
    assert all(results[i] == expected for i in range(4))


def test_evaluation_error_is_a_policy_error_and_engine_recovers(tmp_path: Path) -> None:
    copy = tmp_path / "policies"
    shutil.copytree(POLICY_DIR, copy)
    (copy / "tenantgate" / "boom.rego").write_text(
        "package tenantgate.boom\n\nx := 1 / input.zero\n"
    )
    (copy / "tenantgate" / "decision.rego").write_text(
        (copy / "tenantgate" / "decision.rego").read_text().replace(
            "_deny_reasons := (authz.deny | limits.deny) | authn.deny",
            "_deny_reasons := ((authz.deny | limits.deny) | authn.deny) | "
            "{r | r := data.tenantgate.boom.x; input.boom}",
        )
    )
    broken = EmbeddedEvaluator(copy)
    sample = SAMPLES["allow_standard_app_token"]["input"]
    with pytest.raises(PolicyEvaluationError):
        broken.decide({**sample, "boom": True, "zero": "0"})
    assert broken.decide(sample).allow is True


def test_policy_data_with_nan_is_refused_by_name(tmp_path: Path) -> None:
    # Python's json reads NaN, JSON does not allow it, and the revision digest is over canonical JSON.
    from gateway.policy.exceptions import PolicyError
    from gateway.policy.loader import revision_of

    with pytest.raises(PolicyError, match="NaN or Infinity"):
        revision_of({}, {"tenants": {"t": {"limits": {"max_tokens": float("nan")}}}}, tmp_path)
    assert revision_of({}, {"tenants": {}}, tmp_path).startswith("sha256:")
