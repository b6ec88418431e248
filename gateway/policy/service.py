"""The gateway's policy engine: one interface, an embedded (regorus) and an OPA backend.

Both return a validated Decision and the policy revision it was judged under. Every
failure (an evaluation error, a malformed decision, an unreachable OPA) raises a
PolicyError, and the gateway denies with 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import httpx

from gateway.background import BackgroundTask
from gateway.policy.evaluator import EmbeddedEvaluator
from gateway.policy.exceptions import PolicyError, PolicyEvaluationError
from gateway.policy.opa import ARGUMENTS_PATH, DECISION_PARAMS, DECISION_PATH, TOOLS_DECISION_PATH, OpaWatch
from gateway.policy.prepared import PreparedPolicy, build_engine_cooperatively, checked, prepare_elsewhere
from gateway.policy.reads import describe
from gateway.policy.schema import (
    Decision,
    ToolsDecision,
    validate_argument_denials,
    validate_decision,
    validate_tools_decision,
    with_argument_denials,
)

T = TypeVar("T")

logger = logging.getLogger("tenantgate.policy")
# How long a tenant whose evaluation errored is refused (503) without evaluating again.
FAILED_EVALUATION_HOLD_S = 5.0


def _tenant_of(input_document: Mapping) -> str:
    principal = input_document.get("principal")
    return str(principal.get("tenant_id", "")) if isinstance(principal, Mapping) else ""


@dataclass(frozen=True, slots=True)
class Judgement:
    decision: Decision
    revision: str


@dataclass(frozen=True, slots=True)
class ToolsJudgement:
    decision: ToolsDecision
    revision: str


class PolicyEngine(Protocol):
    async def decide(self, input_document: Mapping) -> Judgement: ...
    async def decide_tools(self, input_document: Mapping) -> ToolsJudgement: ...  # data.tenantgate.tools.decision
    def tenant_known(self, tenant_id: str) -> bool | None: ...  # None: the tenant list is not known yet
    def held(self, tenant_id: str) -> bool: ...  # refused without evaluating, for now (its evaluation failed)
    def tenant_enabled(self, tenant_id: str) -> bool | None: ...  # its data says enabled: true (None: not known yet)
    def tenant_ids(self) -> frozenset[str] | None: ...  # the registered tenants (None: not known yet)
    def ready(self) -> bool: ...
    def decision_counts(self) -> dict[tuple[str, str], int]: ...  # (kind, cache) -> decisions: evaluator.counts
    async def start(self) -> None: ...
    async def aclose(self) -> None: ...

    @property
    def revision(self) -> str | None: ...  # the revision serving (None: none has decided yet)

    @property
    def reload_failures(self) -> int | None: ...  # reloads refused (None: the gateway does not reload this one)


class EmbeddedPolicy:
    """regorus in-process; reloads when a policy or data file changes.

    Evaluation runs on the event loop thread: regorus holds the GIL while it evaluates,
    so a worker thread would add a hop and no parallelism, and one evaluation costs about a
    millisecond whatever the number of tenants. An evaluation error is the request's alone
    (its 503); the engine stays. A reload prepares the new revision in a process of its own
    (prepared.py: it reads, parses and digests the files and decides every sample in
    policy_dir/samples with them, holding that interpreter's GIL, not this one's), builds the
    loop's engine from the prepared slices a step at a time, and swaps the evaluator in one
    assignment; a request already judged keeps the revision it was judged under, and a reload
    that fails keeps the last good policy.
    """

    def __init__(self, policy_dir: Path, data_dir: Path | None = None, *,
                 cache_size: int = 0, reload_interval_s: float = 0.0) -> None:
        self._policy_dir = Path(policy_dir)
        self._data_dir = Path(data_dir) if data_dir else self._policy_dir / "data"
        self._cache_size = cache_size
        self._reload_interval_s = reload_interval_s
        self._signature = self._files_signature()
        prepared, engine = checked(self._policy_dir, self._data_dir)
        self._evaluator = EmbeddedEvaluator(source=prepared, engine=engine, cache_size=cache_size)
        _log_reads(prepared)
        self._failing: dict[str, tuple[str, float]] = {}  # tenant -> (revision, refused until): a failed evaluation
        self._watcher = BackgroundTask("tenantgate-policy-watch")
        self.reload_failures = 0
        self._retired_counts: Counter[tuple[str, str]] = Counter()  # the decisions of revisions no longer serving

    @property
    def revision(self) -> str:
        return self._evaluator.revision

    def _files_signature(self) -> tuple:
        files = [*self._policy_dir.rglob("*.rego"), *self._data_dir.rglob("*.json")]
        signature = []
        for path in sorted(files):
            try:
                stat = path.stat()
            except OSError:
                continue
            signature.append((str(path), stat.st_mtime_ns, stat.st_size))
        return tuple(signature)

    async def decide(self, input_document: Mapping) -> Judgement:
        return Judgement(*self._held_evaluation(input_document, lambda evaluator: evaluator.decide(input_document)))

    async def decide_tools(self, input_document: Mapping) -> ToolsJudgement:
        """The tools decision (MCP tools/list, tools/call), held like decide's when it errors."""
        return ToolsJudgement(*self._held_evaluation(input_document,
                                                     lambda evaluator: evaluator.decide_tools(input_document)))

    def _held_evaluation(self, input_document: Mapping, evaluate: Callable[[EmbeddedEvaluator], T]) -> tuple[T, str]:
        """`evaluate` with the serving evaluator, and its revision, unless the tenant is held."""
        evaluator = self._evaluator
        tenant = _tenant_of(input_document)
        if self.held(tenant):
            raise PolicyEvaluationError("this tenant's policy evaluation failed moments ago; retry shortly")
        try:
            return evaluate(evaluator), evaluator.revision
        except PolicyEvaluationError:
            # An evaluation that errors costs regorus ~40 ms on this thread, every time: the
            # failing tenant is refused without evaluating for a while, so it cannot spend the
            # loop that every tenant shares. A reload (a new revision) ends the hold.
            self._failing[tenant] = (evaluator.revision, time.monotonic() + FAILED_EVALUATION_HOLD_S)
            raise

    def held(self, tenant_id: str) -> bool:
        """Whether this tenant's evaluation failed under the serving revision moments ago: its
        requests are refused without one until the hold ends or a reload brings a new revision."""
        held = self._failing.get(tenant_id)
        return held is not None and held[0] == self._evaluator.revision and time.monotonic() < held[1]

    @property
    def _prepared(self) -> PreparedPolicy:
        # Every evaluator of the service is built from a PreparedPolicy (an evaluator may take a PolicySource).
        return self._evaluator.source  # type: ignore[return-value]  # built from a PreparedPolicy

    def tenant_known(self, tenant_id: str) -> bool:
        """Whether policy data registers this tenant (checked before any per-tenant key fetch)."""
        return tenant_id in self._prepared.tenant_ids

    def tenant_enabled(self, tenant_id: str) -> bool:
        return tenant_id in self._prepared.enabled_tenant_ids

    def tenant_ids(self) -> frozenset[str]:
        return self._prepared.tenant_ids

    def ready(self) -> bool:
        return True  # a policy that failed to load never got this far

    def decision_counts(self) -> dict[tuple[str, str], int]:
        return dict(self._retired_counts + self._evaluator.counts())

    async def reload_if_changed(self) -> bool:
        signature = await asyncio.to_thread(self._files_signature)
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            prepared = await prepare_elsewhere(self._policy_dir, self._data_dir)
        except PolicyError as exc:
            self.reload_failures += 1
            logger.error("policy reload failed, keeping revision %s: %s", self.revision, exc)
            return False
        engine = await build_engine_cooperatively(prepared)
        evaluator = EmbeddedEvaluator(source=prepared, engine=engine, cache_size=self._cache_size)
        old = self._evaluator
        self._retired_counts.update(old.counts())  # it decides nothing more: the swap is on this loop's thread
        self._evaluator = evaluator
        self._failing = {}
        logger.info("policy reloaded: %s -> %s", old.revision, evaluator.revision)
        _log_reads(prepared)
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._reload_interval_s)
            try:
                await self.reload_if_changed()
            except Exception:  # the watcher must outlive a bad file system moment
                logger.exception("policy watcher failed once; it keeps watching")

    async def start(self) -> None:
        if self._reload_interval_s > 0:
            self._watcher.start(self._watch())

    async def aclose(self) -> None:
        await self._watcher.stop()


def _log_reads(prepared: PreparedPolicy) -> None:
    for kind, reads in (("policy", prepared.reads), ("tools", prepared.tools_reads)):
        if not reads.cacheable:
            logger.info("%s decisions are not cached: the policy calls %s", kind, reads.uncacheable_because)
        else:  # field names of the input document, never their values
            logger.info("%s decisions are cached by what the policy reads: %s", kind, ", ".join(describe(reads)))


class OpaPolicy:
    """An OPA server (the production sidecar) over its data API.

    httpx rather than opa-python-client: that client retries 5xx and connection errors
    with backoff inside the request, which stretches a fail-closed answer into seconds,
    and it brings a second HTTP stack (aiohttp). Here one bounded timeout decides.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 1.0, refresh_interval_s: float = 2.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._client = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, transport=transport)
        self._watch = OpaWatch(self._client, interval_s=refresh_interval_s)
        self.revision: str | None = None  # the bundles' revision of the last decision (None before the first)
        self._counts: Counter[tuple[str, str]] = Counter()  # every decision is OPA's: the gateway caches none

    async def decide(self, input_document: Mapping) -> Judgement:
        body = await self._ask(DECISION_PATH, input_document)
        judgement = Judgement(validate_decision(body["result"]), _opa_revision(body.get("provenance")))
        self.revision = judgement.revision
        self._counts["request", "off"] += 1  # on the loop's thread, as every decide
        return judgement

    async def decide_tools(self, input_document: Mapping) -> ToolsJudgement:
        body = await self._ask(TOOLS_DECISION_PATH, input_document)
        decision = validate_tools_decision(body["result"])
        if decision.allow and input_document.get("method") == "tools/call":  # then its arguments, as embedded
            denials = validate_argument_denials((await self._ask(ARGUMENTS_PATH, input_document))["result"])
            decision = with_argument_denials(decision, denials)
        judgement = ToolsJudgement(decision, _opa_revision(body.get("provenance")))
        self.revision = judgement.revision
        self._counts["tools", "off"] += 1
        return judgement

    async def _ask(self, path: str, input_document: Mapping) -> dict:
        try:
            response = await self._client.post(
                path, params={**DECISION_PARAMS, "provenance": "true"}, json={"input": input_document}
            )
        except httpx.HTTPError as exc:
            self._watch.healthy = False
            raise PolicyEvaluationError(f"OPA is unreachable ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise PolicyEvaluationError(f"OPA answered HTTP {response.status_code}")
        try:
            body = response.json()
        except json.JSONDecodeError:
            raise PolicyEvaluationError("OPA answered with a body that is not JSON") from None
        if not isinstance(body, dict) or "result" not in body:
            raise PolicyEvaluationError("OPA returned no decision (is the bundle active?)")
        self._watch.healthy = True
        return body

    def held(self, tenant_id: str) -> bool:
        return False  # an evaluation that fails costs the sidecar, not this loop

    def tenant_known(self, tenant_id: str) -> bool | None:
        tenants = self._watch.tenants
        return None if tenants is None else tenant_id in tenants

    def tenant_enabled(self, tenant_id: str) -> bool | None:
        enabled = self._watch.enabled_tenants
        return None if enabled is None else tenant_id in enabled

    def tenant_ids(self) -> frozenset[str] | None:
        return self._watch.tenants

    def ready(self) -> bool:
        return self._watch.healthy and self._watch.tenants is not None

    def decision_counts(self) -> dict[tuple[str, str], int]:
        return dict(self._counts)

    @property
    def reload_failures(self) -> None:
        return None  # OPA's sidecar loads its bundles itself; a bundle it refuses is in its own status

    async def start(self) -> None:
        await self._watch.start()

    async def aclose(self) -> None:
        await self._watch.aclose()
        await self._client.aclose()


def _opa_revision(provenance: object) -> str:
    bundles = provenance.get("bundles") if isinstance(provenance, dict) else None
    if isinstance(bundles, dict) and bundles:
        parts = [f"{name}@{info.get('revision', '')}" for name, info in sorted(bundles.items())
                 if isinstance(info, dict)]
        return "opa:" + ",".join(parts)
    return "opa:unversioned"
