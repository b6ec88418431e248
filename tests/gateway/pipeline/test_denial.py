"""How admission answers a deny: a model the tenant may not use as a 404, a prompt with no room in
the tenant's window (when that is the only reason) as OpenAI's 400, any other as a 403. The shipped
policy no longer denies for the window (the gateway clamps to it), but a policy of the operator's
own may, and its callers still get the 400 that clients trim their history on."""

from __future__ import annotations

import copy

from gateway.errors import ContextLengthExceeded, ModelDenied, PolicyDenied
from gateway.pipeline.admission import MODEL_DENIED_REASON, _denial
from gateway.policy.schema import validate_decision
from gateway.policy.service import Judgement
from tests.gateway.policy.conftest import SAMPLES

NO_ROOM = "the prompt leaves no room in this tenant's context window of 2048 tokens"
REGION = "this deployment's region is not allowed for the tenant"


def _denied(*reasons: str) -> Judgement:
    document = copy.deepcopy(SAMPLES["deny_region_not_allowed"]["expected"])
    document["reasons"] = list(reasons)
    return Judgement(validate_decision(document), "rev")


def test_a_window_deny_alone_is_400_context_length_exceeded_with_both_counts() -> None:
    error = _denial(_denied(NO_ROOM), prompt_tokens=2100)
    assert isinstance(error, ContextLengthExceeded) and error.status_code == 400
    assert "maximum context length is 2048 tokens" in error.message and "resulted in 2100 tokens" in error.message


def test_a_window_deny_beside_another_reason_is_the_ordinary_403() -> None:
    error = _denial(_denied(NO_ROOM, REGION), prompt_tokens=2100)
    assert type(error) is PolicyDenied and error.status_code == 403


def test_a_model_the_tenant_may_not_use_is_404_whatever_else_is_denied() -> None:
    assert isinstance(_denial(_denied(MODEL_DENIED_REASON, NO_ROOM), prompt_tokens=2100), ModelDenied)
