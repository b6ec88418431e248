"""A Rego file that does not parse: the error raised must not keep the half-built regorus engine
alive. Its traceback would hold it, to be freed on whichever thread drops the error, and pyo3 leaks
an engine dropped off its thread (~430 KB per failed reload, issue 24 item 14)."""

from __future__ import annotations

import pytest
import regorus

from gateway.policy.exceptions import PolicySyntaxError
from gateway.policy.loader import PolicySource, new_engine
from gateway.policy.prepared import PreparedPolicy, engine_steps

GOOD = "package tenantgate.ok\n\nallow := true\n"
BROKEN = "package tenantgate.broken\n\nallow := {\n"


def _engines_held(exc: BaseException) -> list[str]:
    """Every frame of the error's traceback (and of the errors it chains) that holds an engine."""
    held, seen, pending = [], set(), [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            held += [f"{frame.f_code.co_name}:{name}" for name, value in frame.f_locals.items()
                     if isinstance(value, regorus.Engine)]
            tb = tb.tb_next
        pending += [error.__cause__, error.__context__]
    return held


def test_a_syntax_error_from_new_engine_holds_no_engine() -> None:
    source = PolicySource(modules={"ok.rego": GOOD, "broken.rego": BROKEN}, data={}, revision="sha256:0")
    with pytest.raises(PolicySyntaxError) as caught:
        new_engine(source)
    assert caught.value.path == "broken.rego"
    assert _engines_held(caught.value) == []


def test_a_syntax_error_from_a_stepped_build_holds_no_engine() -> None:
    prepared = PreparedPolicy(revision="sha256:0", modules={"ok.rego": GOOD, "broken.rego": BROKEN},
                              data_slices=('{"tenants": {}}',), tenant_ids=frozenset(),
                              enabled_tenant_ids=frozenset())
    with pytest.raises(PolicySyntaxError) as caught:
        for _ in engine_steps(prepared):
            pass
    assert _engines_held(caught.value) == []


def test_the_check_finds_an_engine_a_traceback_holds() -> None:
    """The check itself can fail: an error raised where the engine is still a local is caught."""
    def raising_beside_an_engine() -> None:
        engine = regorus.Engine()
        raise PolicySyntaxError("x.rego", 1, f"held {type(engine).__name__}")

    with pytest.raises(PolicySyntaxError) as caught:
        raising_beside_an_engine()
    assert _engines_held(caught.value) == ["raising_beside_an_engine:engine"]
