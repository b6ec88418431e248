"""The request path both completion endpoints share: judge, admit, run, account.

    token ids ─▶ policy decision ─▶ clamp and envelope ─▶ budget ─▶ engine ─▶ usage, audit

Each step raises a GatewayError the handlers turn into OpenAI's error shape; nothing
reaches the engine unless every step before it said yes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi import Request

from engine.async_engine import EngineDeadError
from engine.envelope import CacheScope, EnvelopeError, ExecutionEnvelope, Isolation, keyed_digest
from engine.llm_engine import RequestError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams, SamplingParamsError
from gateway.auth.principal import Principal
from gateway.deps import Gateway
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelDenied,
    ModelNotFound,
    PolicyDenied,
    RateLimited,
    Unavailable,
)
from gateway.limits import Admission, QuotaStoreUnavailable, Ticket
from gateway.openai.protocol import SamplingFields
from gateway.policy.exceptions import PolicyError
from gateway.policy.schema import Decision
from gateway.policy.service import Judgement

logger = logging.getLogger("tenantgate.gateway")

CLASSIFICATION_HEADER = "x-data-classification"
# The reason policies/authz gives when a tenant may not use the model; such a deny is answered as 404.
MODEL_DENIED_REASON = "the requested model is not available to this tenant"


class ClientGone(Exception):
    """The caller disconnected before the answer was ready."""


@dataclass
class Admitted:
    """A request that passed every check, with what the engine and the accounting need."""

    request_id: str
    route: str
    principal: Principal
    judgement: Judgement
    envelope: ExecutionEnvelope
    params: SamplingParams
    token_ids: list[int]
    ticket: Ticket
    request_body: dict = field(default_factory=dict)  # for a record only when the decision allows content
    started: float = field(default_factory=time.perf_counter)
    created: int = field(default_factory=lambda: int(time.time()))
    output_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    texts: list[str] | None = None  # the completion, kept only when the decision allows content in records

    @property
    def keeps_content(self) -> bool:
        return self.judgement.decision.logging.content == "redacted"


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(gateway: Gateway, model: str) -> None:
    if model != gateway.backend.model_name:
        raise ModelNotFound()


def unsupported(body: SamplingFields) -> None:
    """OpenAI fields the engine has no equivalent for: refused, never silently ignored."""
    if body.n != 1:
        raise InvalidRequest("n must be 1: this gateway returns one choice per request", param="n")
    if body.presence_penalty or body.frequency_penalty:
        param = "presence_penalty" if body.presence_penalty else "frequency_penalty"
        raise InvalidRequest(f"{param} is not supported (only 0)", param=param)
    if body.logit_bias:
        raise InvalidRequest("logit_bias is not supported", param="logit_bias")
    if body.seed is not None and not 0 <= body.seed < 2**63:
        raise InvalidRequest("seed must be an integer in [0, 2**63)", param="seed")


def policy_input(gateway: Gateway, principal: Principal, request: Request, *, route: str, model: str,
                 stream: bool, prompt_tokens: int, max_tokens: int | None, temperature: float | None) -> dict:
    settings = gateway.settings
    document = {
        "principal": principal.policy_input(),
        "request": {
            "route": route,
            "model": model,
            "stream": stream,
            "prompt_tokens": prompt_tokens,
            "temperature": 1.0 if temperature is None else temperature,
            "data_classification": request.headers.get(CLASSIFICATION_HEADER, settings.default_data_classification),
        },
        "deployment": {"region": settings.region, "environment": settings.environment},
    }
    if max_tokens is not None:
        document["request"]["max_tokens"] = max_tokens
    return document


async def judge(gateway: Gateway, request: Request, document: dict) -> Judgement:
    backend = gateway.settings.policy_backend
    started = time.perf_counter()
    try:
        judgement = await gateway.policy.decide(document)
    except PolicyError as exc:
        # The reason goes to the server log (it names a rule or a field, never content).
        logger.error("policy failed closed: %s", exc)
        request.state.decision = "error"
        raise Unavailable("the policy engine could not decide this request; it is denied") from None
    finally:
        gateway.metrics.policy_latency.labels(backend).observe(time.perf_counter() - started)
    request.state.decision = "allow" if judgement.decision.allow else "deny"
    if not judgement.decision.allow:
        reasons = judgement.decision.reasons
        denied = (ModelDenied if MODEL_DENIED_REASON in reasons else PolicyDenied)(reasons, judgement.revision)
        denied.judgement = judgement  # for the audit record
        raise denied
    return judgement


def envelope_for(gateway: Gateway, principal: Principal, judgement: Judgement) -> ExecutionEnvelope:
    decision = judgement.decision
    key = gateway.settings.namespace_key
    scope = CacheScope(decision.cache.scope)
    if decision.limits.kv_blocks < 1:
        raise PolicyDenied(["the tenant's policy grants no KV cache blocks"], judgement.revision)
    try:
        return ExecutionEnvelope(
            cache_namespace=None if scope is CacheScope.NONE else keyed_digest(key, "namespace:" + decision.cache.namespace),
            cache_scope=scope,
            isolation=Isolation(decision.batching.isolation),
            isolation_key=keyed_digest(key, "tenant:" + principal.tenant_id),
            deterministic=decision.batching.deterministic,
            kv_block_quota=decision.limits.kv_blocks,
            priority=decision.limits.priority,
        )
    except (EnvelopeError, ValueError):
        logger.error("a decision could not become an execution envelope")
        raise Unavailable("the policy decision could not be applied; the request is denied") from None


def effective_max_tokens(gateway: Gateway, decision: Decision, requested: int | None, prompt_tokens: int) -> int:
    """The decision's max_tokens, clamped again by the context caps (the policy may be older than the model)."""
    context = min(decision.limits.max_context_tokens, gateway.backend.max_model_len)
    room = context - prompt_tokens
    if room < 1:
        raise InvalidRequest(
            f"the prompt has {prompt_tokens} tokens and leaves no room in the {context}-token context window",
            param="messages", code="context_length_exceeded")
    wanted = decision.limits.max_tokens if requested is None else requested
    return max(1, min(wanted, decision.limits.max_tokens, room))


async def admit(gateway: Gateway, request: Request, principal: Principal, body: SamplingFields, *,
                route: str, request_id: str, token_ids: list[int], requested_max_tokens: int | None,
                logprobs: int | None, special_token_ids: Callable[[], list[int]] | None = None) -> Admitted:
    """Judges, clamps and reserves a request. The policy sees the prompt's count as plain text;
    when its decision reads special tokens, special_token_ids() gives the ids that run instead."""
    unsupported(body)
    document = policy_input(gateway, principal, request, route=route, model=body.model, stream=body.stream,
                            prompt_tokens=len(token_ids), max_tokens=requested_max_tokens,
                            temperature=body.temperature)
    judgement = None
    try:
        judgement = await judge(gateway, request, document)
        # After the policy: a model the tenant may not use and one not served get the same 404,
        # and any other deny the same 403, whether the name is served or not.
        check_model(gateway, body.model)
        decision = judgement.decision
        if decision.prompt.special_tokens and special_token_ids is not None:
            token_ids = special_token_ids()
        max_tokens = effective_max_tokens(gateway, decision, requested_max_tokens, len(token_ids))
        envelope = envelope_for(gateway, principal, judgement)
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                seed=body.seed,
                stop=body.stop_list(),
                logprobs=logprobs,
            )
        except SamplingParamsError as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        ticket = await reserve(gateway, principal, decision, request_id, len(token_ids) + max_tokens)
    except GatewayError as exc:
        judgement = judgement or getattr(exc, "judgement", None)
        audit_refusal(gateway, request_id, route, principal, judgement, len(token_ids), exc)
        raise
    admitted = Admitted(request_id, route, principal, judgement, envelope, params, token_ids, ticket)
    if admitted.keeps_content:
        admitted.request_body = body.model_dump(mode="json", exclude_none=True)
        admitted.texts = []
    return admitted


def _decision_summary(decision: Decision) -> dict:
    return {"allow": decision.allow, "reasons": decision.reasons, "cache_scope": decision.cache.scope,
            "isolation": decision.batching.isolation, "deterministic": decision.batching.deterministic,
            "logging": decision.logging.content, "special_tokens": decision.prompt.special_tokens,
            "max_tokens": decision.limits.max_tokens}


def audit_refusal(gateway: Gateway, request_id: str, route: str, principal: Principal,
                  judgement: Judgement | None, prompt_tokens: int, error: GatewayError) -> None:
    """A judged request that never reached the engine still leaves its record."""
    gateway.audit.write({
        "request_id": request_id, "route": route, **gateway.audit.principal_digests(principal),
        "policy_revision": judgement.revision if judgement else None,
        "decision": _decision_summary(judgement.decision) if judgement else None,
        "model_fingerprint": gateway.backend.fingerprint,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "cached_tokens": 0},
        "status": error.status_code, "outcome": error.code or error.type,
    })


QUOTA_STORE_RETRY_S = 2.0


async def reserve(gateway: Gateway, principal: Principal, decision: Decision, request_id: str,
                  tokens: int) -> Ticket:
    """Admits the request against its budgets; fail closed when the quota store is down,
    unless the tenant's decision allows fail-open (then served, unaccounted)."""
    limits = decision.limits
    admission = Admission(
        **gateway.audit.principal_digests(principal),
        request_id=request_id, tokens=tokens,
        requests_per_minute=limits.requests_per_minute, tokens_per_minute=limits.tokens_per_minute,
        principal_requests_per_minute=limits.principal_requests_per_minute,
        principal_tokens_per_minute=limits.principal_tokens_per_minute,
        concurrent_requests=limits.concurrent_requests,
    )
    try:
        return await gateway.limiter.admit(admission)
    except RateLimited:
        gateway.metrics.rate_limited.labels("budget").inc()
        raise
    except QuotaStoreUnavailable:
        if limits.fail_open:
            gateway.metrics.rate_limited.labels("fail_open").inc()
            return Ticket(admission, accounted=False)
        gateway.metrics.rate_limited.labels("store_unavailable").inc()
        raise RateLimited("the quota store is unreachable, so this request is refused (fail closed); "
                          "retry shortly", QUOTA_STORE_RETRY_S, code="quota_store_unavailable") from None


async def stream_outputs(gateway: Gateway, admitted: Admitted) -> AsyncIterator[RequestOutput]:
    """The engine's deltas for an admitted request; engine trouble becomes a GatewayError."""
    outputs = gateway.backend.generate(admitted.token_ids, admitted.params, admitted.envelope, admitted.request_id)
    try:
        async for output in outputs:
            admitted.output_tokens = output.num_output_tokens
            admitted.cached_tokens = output.num_cached_tokens
            if admitted.texts is not None:
                admitted.texts.append(output.new_text)
            if output.finished:
                admitted.finish_reason = output.finish_reason
            yield output
    except RequestError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    except EngineDeadError:
        raise Unavailable("the inference engine is not running") from None
    finally:
        await outputs.aclose()  # a request left unfinished is aborted here, not when collected


async def until_disconnect(request: Request, awaitable):
    """Awaits `awaitable`, or cancels it and raises ClientGone when the caller disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(awaitable)
    watch = asyncio.create_task(disconnected())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()  # inside the engine stream, cancellation aborts the engine request
    if work not in done:
        try:
            await work
        except asyncio.CancelledError:
            pass
        raise ClientGone()
    return work.result()


async def collect(gateway: Gateway, admitted: Admitted, request: Request) -> list[RequestOutput]:
    """Runs a non-streaming request to its end, aborting it if the caller disconnects first."""

    async def run() -> list[RequestOutput]:
        return [output async for output in stream_outputs(gateway, admitted)]

    return await until_disconnect(request, run())


@contextmanager
def accounted(gateway: Gateway, admitted: Admitted) -> Iterator[None]:
    """Finishes an admitted request that fails before its response is handed over."""
    try:
        yield
    except GatewayError as exc:
        finish(gateway, admitted, status=exc.status_code, outcome="error")
        raise
    except BaseException:
        finish(gateway, admitted, status=499, outcome="client_disconnected")
        raise


def finish(gateway: Gateway, admitted: Admitted, *, status: int, outcome: str) -> None:
    """Settles the token budget and writes the audit record (once per request)."""
    used = len(admitted.token_ids) + admitted.output_tokens
    # A task of its own: settling must happen even when the caller's task is being cancelled.
    settle = asyncio.get_running_loop().create_task(gateway.limiter.settle(admitted.ticket, used))
    gateway.background.add(settle)
    settle.add_done_callback(gateway.background.discard)
    tenant_tag = admitted.ticket.admission.tenant[:12]
    gateway.metrics.tokens.labels("input", tenant_tag).inc(len(admitted.token_ids))
    gateway.metrics.tokens.labels("output", tenant_tag).inc(admitted.output_tokens)
    decision = admitted.judgement.decision
    record = {
        "request_id": admitted.request_id,
        "route": admitted.route,
        **gateway.audit.principal_digests(admitted.principal),
        "policy_revision": admitted.judgement.revision,
        "decision": _decision_summary(decision) | {"max_tokens": admitted.params.max_tokens},
        "model_fingerprint": gateway.backend.fingerprint,
        "usage": {"prompt_tokens": len(admitted.token_ids), "completion_tokens": admitted.output_tokens,
                  "cached_tokens": admitted.cached_tokens},
        "finish_reason": admitted.finish_reason,
        "latency_ms": round((time.perf_counter() - admitted.started) * 1000, 3),
        "status": status,
        "outcome": outcome,
    }
    if admitted.keeps_content:
        content = gateway.audit.content(decision, admitted.request_body, "".join(admitted.texts or ()))
        if content is not None:
            record["content"] = content
    gateway.audit.write_after_engine(gateway.backend, admitted.request_id, record)
