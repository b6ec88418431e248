"""Admission: judge a request, clamp it, pick where it may run, reserve its budget.

Each step raises a GatewayError that the protocol layer renders in its own error shape;
nothing reaches a deployment unless every step before it said yes.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from engine import EnvelopeError, ExecutionEnvelope, SamplingParams, SamplingParamsError, random_hex, random_uuid
from gateway.auth.challenge import challenge_header, claims_request
from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.errors import (
    AuditUnavailable,
    AuthenticationContextRequired,
    ClaimsChallenge,
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelDenied,
    ModelNotFound,
    PolicyDenied,
    RateLimited,
    TokenRevoked,
    Unavailable,
)
from gateway.json_values import json_depth
from gateway.limits import Admission, QuotaStoreUnavailable, Ticket
from gateway.pipeline.envelope import envelope_for_decision
from gateway.pipeline.exchange import DECISION_ID_HEADER, MAX_TOKENS_CLAMPED_HEADER, Exchange
from gateway.policy.exceptions import PolicyError
from gateway.policy.schema import Decision
from gateway.policy.service import Judgement
from gateway.tracing import OPERATIONS, RequestTrace

if TYPE_CHECKING:
    from gateway.deployments.routing import Target

logger = logging.getLogger("tenantgate.gateway")

# The reason policies/authz gives when a tenant may not use the model; such a deny is answered as 404.
MODEL_DENIED_REASON = "the requested model is not available to this tenant"
# A prompt with no room left in the tenant's window, alone, is answered as 400. The shipped policy leaves
# the window to effective_max_tokens (its decisions do not read the prompt's length, so they are cached);
# a policy of the operator's own may still deny with this reason, as earlier revisions of it did.
CONTEXT_DENIED_REASON = re.compile(r"the prompt leaves no room in this tenant's context window of (\d+) tokens")
# policies/authn: a token without a context the request needs (a deny a new token cures).
AUTH_CONTEXT_REASON = re.compile(r"this request needs authentication context (c[0-9]{1,2})")
REVOKED_CHALLENGE = "the access token has been revoked; get a new one with the claims this challenge names"
QUOTA_STORE_RETRY_S = 2.0
EMBEDDINGS_ROUTE = "embeddings"
LISTING_ROUTE = "models.list"  # the route gateway/openai/models asks the policy about
POLICY_REFUSAL = "the policy engine could not decide this request; it is denied"


@dataclass(frozen=True)
class Ask:
    """What a caller asked for, in the pipeline's terms (a protocol's service builds it)."""

    route: str
    request_id: str
    model: str
    stream: bool
    prompt_tokens: int  # as the policy sees it: the prompt counted as plain text
    token_ids: list[int]  # what runs on a deployment that takes ids; [] when the model has no tokenizer here
    max_tokens: int | None  # as requested
    n: int = 1  # choices
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    top_k: int | None = None  # -1 and 0: off
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (decimal string) -> bias
    json_schema: str | None = None  # structured outputs: the schema the answer must match, as JSON text
    schema_param: str = "response_format"  # the field it came from (tools, for tool_choice required or named)
    body: dict = field(default_factory=dict)  # the request as sent (wire names): upstreams and content records
    # When the decision reads special tokens (completions), the ids that run instead of token_ids.
    special_token_ids: Callable[[], list[int]] | None = None
    # Embeddings: each input's ids for the embedded encoder (None: the inputs go as sent, in body).
    embed_inputs: list[list[int]] | None = None
    # Embeddings: the texts of token ids the model reads as cl100k_base, which an upstream is sent
    # in their place (body keeps them as the caller sent them, for content records).
    embed_texts: list[str] | None = None
    # What a deployment runs it as, when that is not `route` (responses run as chat.completions).
    runs_as: str | None = None

    @property
    def embeds(self) -> bool:
        return self.route == EMBEDDINGS_ROUTE

    @property
    def deployment_route(self) -> str:
        return self.runs_as or self.route


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check: what its policy decided, the envelope and sampling it runs
    under, where it may run and the budget it holds. What happens to it then is its Run's
    (gateway/pipeline/run.py)."""

    ask: Ask
    principal: Principal
    judgement: Judgement
    envelope: ExecutionEnvelope
    params: SamplingParams | None  # None for embeddings: nothing is sampled
    token_ids: list[int]  # what runs on a deployment that takes ids
    prompt_tokens: int  # the gateway's count (a deployment may report its own)
    ticket: Ticket
    targets: tuple[Target, ...]  # where it may run, in the order to try
    decision_id: str  # the audit record's, sent as a header
    trace: RequestTrace  # the request's spans (gateway/tracing.py)
    started: float = field(default_factory=time.perf_counter)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def request_id(self) -> str:
        return self.ask.request_id

    @property
    def route(self) -> str:
        return self.ask.route

    @property
    def keeps_content(self) -> bool:
        return self.judgement.decision.logging.content == "redacted"


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{random_hex()}"


def policy_input(gateway: Gateway, principal: Principal, exchange: Exchange, *, route: str, model: str,
                 stream: bool, prompt_tokens: int, max_tokens: int | None, temperature: float | None,
                 n: int = 1) -> dict:
    settings = gateway.settings
    document = {
        "principal": principal.policy_input(),
        "request": {
            "route": route,
            "model": model,
            "stream": stream,
            "prompt_tokens": prompt_tokens,
            "n": n,
            "temperature": 1.0 if temperature is None else temperature,
            "data_classification": (settings.default_data_classification if exchange.data_classification is None
                                    else exchange.data_classification),
        },
        "deployment": {"region": settings.region, "environment": settings.environment},
    }
    if max_tokens is not None:
        document["request"]["max_tokens"] = max_tokens
    return document


async def judge(gateway: Gateway, exchange: Exchange, document: dict) -> Judgement:
    backend = gateway.settings.policy_backend
    started = time.perf_counter()
    with exchange.trace.stage("policy", **{"tenantgate.policy.backend": backend}) as span:
        try:
            judgement = await gateway.policy.decide(document)
        except PolicyError as exc:
            # The reason goes to the server log (it names a rule or a field, never content).
            logger.error("policy failed closed: %s", exc)
            exchange.decision = "error"
            raise Unavailable(POLICY_REFUSAL) from None
        finally:
            gateway.metrics.policy_time(backend).observe(time.perf_counter() - started)
        decision = judgement.decision
        span.set_attributes({
            "tenantgate.policy.revision": judgement.revision, "tenantgate.decision.allow": decision.allow,
            "tenantgate.decision.cache_scope": decision.cache.scope,
            "tenantgate.decision.isolation": decision.batching.isolation,
            "tenantgate.decision.deterministic": decision.batching.deterministic,
            "tenantgate.decision.speculative": decision.batching.speculative,
            "tenantgate.decision.logging": decision.logging.content,
        })
    exchange.decision = "allow" if judgement.decision.allow else "deny"
    if judgement.decision.logging.metrics_name:  # the tenant's policy lets its name be the label
        exchange.tenant_label = judgement.decision.logging.metrics_name
    # A model listing asks each model's question of a one-token request: a model that needs a step-up
    # is left out of it (the policy's deny), and only a revoked token refuses the listing itself.
    step_up = document.get("request", {}).get("route") != LISTING_ROUTE
    refusal = authentication_refusal(gateway.verifier.authority, judgement, document.get("principal", {}),
                                     time.time(), step_up=step_up)
    if refusal is not None:
        exchange.decision = "deny"
        refusal.judgement = judgement  # for the audit record
        raise refusal
    if not judgement.decision.allow:
        denied = _denial(judgement, document["request"].get("prompt_tokens", 0))
        denied.judgement = judgement  # for the audit record
        raise denied
    return judgement


def authentication_refusal(authority: str, judgement: Judgement, principal: dict, now: float, *,
                           step_up: bool = True) -> GatewayError | None:
    """Conditional Access, as the decision's authentication section asks: a revoked token, a missing
    authentication context or a sign-in older than max_age_s is answered with Entra's claims
    challenge (401) when the client declared cp1, else with a 401 (revoked) or a 403 naming the
    context. None when the token shows what the request needs, or when the decision denies for a
    reason no new token would cure (that denial answers instead). The token's auth_time is compared
    with the clock here, not in Rego, so decisions stay cacheable. Without step_up only revocation
    is answered here."""
    decision = judgement.decision
    needs = decision.authentication
    if needs.revoked:
        if needs.challenge:
            fresh = claims_request([], not_before=int(now))  # a token issued from now on, as Entra's CAE asks
            return ClaimsChallenge(REVOKED_CHALLENGE, challenge_header(authority, fresh))
        return TokenRevoked()
    if not step_up or (not decision.allow
                       and any(not AUTH_CONTEXT_REASON.fullmatch(reason) for reason in decision.reasons)):
        return None
    stale = needs.max_age_s > 0 and not _signed_in_within(principal.get("auth_time"), needs.max_age_s, now)
    if not needs.missing and not stale:
        return None
    wants = list(needs.missing) if not stale else list(needs.contexts)
    problems = [f"authentication context {', '.join(needs.missing)}"] if needs.missing else []
    if stale:
        problems.append(f"a sign-in within the last {needs.max_age_s} seconds")
    message = "this request needs " + " and ".join(problems)
    if not needs.challenge:
        return AuthenticationContextRequired(message + "; sign in with it and retry")
    request = claims_request(wants, not_before=int(now) if stale else None)
    return ClaimsChallenge(message, challenge_header(authority, request, max_age_s=needs.max_age_s if stale else 0))


def _signed_in_within(auth_time: object, max_age_s: int, now: float) -> bool:
    """Whether the token's sign-in (auth_time, as validated into the input) is recent enough; a
    token without one never is (fail closed)."""
    if isinstance(auth_time, bool) or not isinstance(auth_time, int):
        return False
    return now - auth_time <= max_age_s


def _denial(judgement: Judgement, prompt_tokens: int) -> GatewayError:
    """A model the tenant may not use is 404; a prompt too long for the tenant's window, when that
    is the only reason, is OpenAI's 400 context_length_exceeded; any other deny is 403."""
    reasons = judgement.decision.reasons
    if MODEL_DENIED_REASON in reasons:
        return ModelDenied(reasons, judgement.revision)
    windows = [window for reason in reasons if (window := CONTEXT_DENIED_REASON.fullmatch(reason))]
    if reasons and len(windows) == len(reasons):
        return ContextLengthExceeded(prompt_tokens, int(windows[0][1]), tenants=True)
    return PolicyDenied(reasons, judgement.revision)


def envelope_for(gateway: Gateway, principal: Principal, judgement: Judgement) -> ExecutionEnvelope:
    decision = judgement.decision
    if decision.limits.kv_blocks < 1:
        raise PolicyDenied(["the tenant's policy grants no KV cache blocks"], judgement.revision)
    try:
        return envelope_for_decision(gateway.settings.namespace_key, principal.tenant_id, decision)
    except (EnvelopeError, ValueError):
        logger.error("a decision could not become an execution envelope")
        raise Unavailable("the policy decision could not be applied; the request is denied") from None


def effective_max_tokens(decision: Decision, context_cap: int | None, requested: int | None,
                         prompt_tokens: int) -> int:
    """The decision's max_tokens, clamped again by the context caps (the policy may be older than the model)."""
    context, tenants = decision.limits.max_context_tokens, True
    if context_cap is not None and context_cap < context:
        context, tenants = context_cap, False
    room = context - prompt_tokens
    if room < 1:
        raise ContextLengthExceeded(prompt_tokens, context, tenants=tenants)
    wanted = decision.limits.max_tokens if requested is None else requested
    return max(1, min(wanted, decision.limits.max_tokens, room))


def check_schema_bounds(json_schema: str, param: str, decision: Decision) -> None:
    """Structured outputs within the policy's bounds on schema size and nesting, else a 400 naming
    the field the schema came from."""
    size, limit = len(json_schema.encode()), decision.limits.max_schema_bytes
    if size > limit:
        raise InvalidRequest(f"{param}: the JSON schema has {size} bytes (as compact JSON); this tenant's "
                             f"limit is {limit}", param=param, code="invalid_json_schema")
    depth, limit = json_depth(json.loads(json_schema)), decision.limits.max_schema_depth
    if depth > limit:
        raise InvalidRequest(f"{param}: the JSON schema nests {depth} levels deep; this tenant's limit is "
                             f"{limit}", param=param, code="invalid_json_schema")


def _sampling_params(ask: Ask, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            n=ask.n,
            temperature=1.0 if ask.temperature is None else ask.temperature,
            top_p=1.0 if ask.top_p is None else ask.top_p,
            top_k=max(ask.top_k or 0, 0),
            min_p=ask.min_p or 0.0,
            presence_penalty=ask.presence_penalty or 0.0,
            frequency_penalty=ask.frequency_penalty or 0.0,
            logit_bias=ask.logit_bias or (),  # type: ignore[arg-type]  # a mapping of ids, normalised there
            seed=ask.seed,
            stop=ask.stop,
            logprobs=ask.logprobs,
            json_schema=ask.json_schema,
        )
    except SamplingParamsError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None


async def admit(gateway: Gateway, exchange: Exchange, principal: Principal, ask: Ask) -> Admitted:
    """Judges, clamps, routes and reserves a request. The policy sees the prompt's count as plain
    text; when its decision reads special tokens, ask.special_token_ids() gives the ids that run."""
    document = policy_input(gateway, principal, exchange, route=ask.route, model=ask.model, stream=ask.stream,
                            prompt_tokens=ask.prompt_tokens, max_tokens=ask.max_tokens, temperature=ask.temperature,
                            n=ask.n)
    judgement = None
    token_ids, prompt_tokens = ask.token_ids, ask.prompt_tokens
    # Known before the answer, so a refusal and a success alike name their audit record.
    decision_id = random_uuid()
    exchange.request_id = ask.request_id
    exchange.add_headers({DECISION_ID_HEADER: decision_id})
    trace = exchange.trace
    trace_request(trace, gateway, ask, decision_id)
    if not gateway.audit.accepting:
        # No work starts whose record the trail may not keep; nor does its refusal take the room
        # that the records of requests already running need.
        gateway.metrics.audit_unavailable.inc()
        raise AuditUnavailable()
    try:
        judgement = await judge(gateway, exchange, document)
        # After the policy: a model the tenant may not use and one not served get the same 404,
        # and any other deny the same 403, whether the name is served or not.
        served = gateway.models.get(ask.model)
        if served is None:
            raise ModelNotFound()
        if (served.task == "embed") != ask.embeds:
            raise InvalidRequest(f"model {ask.model} does not serve {'embeddings' if ask.embeds else ask.route}",
                                 param="model", code="invalid_value")
        decision = judgement.decision
        if decision.prompt.special_tokens and ask.special_token_ids is not None:
            token_ids = ask.special_token_ids()
            prompt_tokens = len(token_ids)
        max_tokens, params = 0, None  # embeddings generate nothing: the budget holds their inputs
        if not ask.embeds:
            max_tokens = effective_max_tokens(decision, served.max_model_len, ask.max_tokens, prompt_tokens)
            if ask.max_tokens is not None and max_tokens < ask.max_tokens:
                exchange.add_headers({MAX_TOKENS_CLAMPED_HEADER: str(max_tokens)})
            if ask.n > decision.limits.max_choices:  # fewer choices than asked would be a silent change
                raise InvalidRequest(f"n may be at most {decision.limits.max_choices} for this tenant, "
                                     f"got {ask.n}", param="n")
        if ask.json_schema is not None:
            check_schema_bounds(ask.json_schema, ask.schema_param, decision)
        envelope = envelope_for(gateway, principal, judgement)
        targets = gateway.router.targets(served, envelope, principal.tenant_id, ask.request_id, judgement.revision)
        if not ask.embeds:
            params = _sampling_params(ask, max_tokens)
        # Each choice may generate max_tokens; the prompt runs (and counts) once.
        reserved = prompt_tokens + ask.n * max_tokens
        with trace.stage("quota", **{"tenantgate.quota.tokens": reserved}) as span:
            ticket = await reserve(gateway, principal, decision, ask.request_id, reserved, embeds=ask.embeds)
            span.set_attribute("tenantgate.quota.accounted", ticket.accounted)
    except GatewayError as exc:
        judgement = judgement or cast("Judgement | None", exc.judgement)
        with trace.stage("audit"):
            audit_refusal(gateway, ask, principal, judgement, prompt_tokens, exc, decision_id)
        raise
    exchange.add_headers(ticket.headers)
    return Admitted(ask, principal, judgement, envelope, params, token_ids, prompt_tokens, ticket, tuple(targets),
                    decision_id=decision_id, trace=trace)


def trace_request(trace: RequestTrace, gateway: Gateway, ask: Ask, decision_id: str) -> None:
    """The server span's name and request attributes. A model name this gateway does not serve is
    the caller's text, so it stays out (the span is then named by the operation alone)."""
    operation = OPERATIONS.get(ask.route, ask.route)
    model = ask.model if ask.model in gateway.models else None
    trace.name(operation, model)
    trace.set({"gen_ai.operation.name": operation, "gen_ai.request.model": model,
               "gen_ai.request.max_tokens": ask.max_tokens, "gen_ai.request.temperature": ask.temperature,
               "gen_ai.request.top_p": ask.top_p, "gen_ai.request.seed": ask.seed,
               "gen_ai.request.stream": ask.stream, "tenantgate.decision_id": decision_id})


def decision_summary(decision: Decision) -> dict:
    return {"allow": decision.allow, "reasons": decision.reasons, "cache_scope": decision.cache.scope,
            "isolation": decision.batching.isolation, "deterministic": decision.batching.deterministic,
            "speculative": decision.batching.speculative, "logging": decision.logging.content,
            "special_tokens": decision.prompt.special_tokens,
            "max_tokens": decision.limits.max_tokens}


def audit_refusal(gateway: Gateway, ask: Ask, principal: Principal, judgement: Judgement | None,
                  prompt_tokens: int, error: GatewayError, decision_id: str) -> None:
    """A judged request that never reached a deployment still leaves its record."""
    gateway.audit.write({
        "decision_id": decision_id,
        "request_id": ask.request_id, "route": ask.route, **gateway.audit.principal_digests(principal),
        "policy_revision": judgement.revision if judgement else None,
        "decision": decision_summary(judgement.decision) if judgement else None,
        # A name this gateway does not serve is the caller's text: it stays out of the trail.
        "model": ask.model if ask.model in gateway.models else None, "deployment": None,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "cached_tokens": 0},
        "status": error.status_code, "outcome": error.code or error.type,
    })


async def reserve(gateway: Gateway, principal: Principal, decision: Decision, request_id: str,
                  tokens: int, *, embeds: bool = False) -> Ticket:
    """Admits the request against its budgets; fail closed when the quota store is down,
    unless the tenant's decision allows fail-open (then served, unaccounted)."""
    limits = decision.limits
    admission = Admission(
        **gateway.audit.principal_digests(principal),
        request_id=request_id, tokens=tokens,
        requests_per_minute=limits.requests_per_minute, tokens_per_minute=limits.tokens_per_minute,
        principal_requests_per_minute=limits.principal_requests_per_minute,
        principal_tokens_per_minute=limits.principal_tokens_per_minute,
        concurrent_requests=limits.concurrent_requests, embeds=embeds,
    )
    try:
        ticket = await gateway.limiter.admit(admission)
    except RateLimited as exc:
        gateway.metrics.rate_limited.labels("budget").inc()
        gateway.headroom.observe(admission, exc.headers, admitted=False)
        raise
    except QuotaStoreUnavailable:
        if limits.fail_open:
            gateway.metrics.rate_limited.labels("fail_open").inc()
            return Ticket(admission, accounted=False)
        gateway.metrics.rate_limited.labels("store_unavailable").inc()
        raise RateLimited("the quota store is unreachable, so this request is refused (fail closed); "
                          "retry shortly", QUOTA_STORE_RETRY_S, code="quota_store_unavailable") from None
    gateway.headroom.observe(admission, ticket.headers, admitted=True)
    return ticket
