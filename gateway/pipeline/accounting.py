"""Accounting: settle the budget on the real counts and write the audit record, once per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.audit import digest_label
from gateway.deps import Gateway
from gateway.errors import GatewayError
from gateway.pipeline.admission import Admitted, decision_summary


@contextmanager
def accounted(gateway: Gateway, admitted: Admitted) -> Iterator[None]:
    """Finishes an admitted request that fails before its response is handed over."""
    try:
        yield
    except GatewayError as exc:
        finish(gateway, admitted, status=exc.status_code, outcome="error", error_code=exc.code)
        raise
    except BaseException:
        finish(gateway, admitted, status=499, outcome="client_disconnected")
        raise


def finish(gateway: Gateway, admitted: Admitted, *, status: int, outcome: str,
           error_code: str | None = None) -> asyncio.Task | None:
    """Settles the token budget, observes the GenAI metrics and writes the audit record (once per
    request: a second call, as when recorded() refused a success, does nothing). error_code: the
    GatewayError's code when outcome is "error". Returns what recorded() waits for."""
    if admitted.finished:
        return None
    admitted.finished = True
    used = admitted.prompt_tokens + admitted.output_tokens
    # A task of its own: settling must happen even when the caller's task is being cancelled.
    settle = asyncio.get_running_loop().create_task(gateway.limiter.settle(admitted.ticket, used))
    gateway.background.add(settle)
    settle.add_done_callback(gateway.background.discard)
    ended = time.perf_counter()
    gateway.metrics.served(
        admitted.route, admitted.ask.model,
        admitted.judgement.decision.logging.metrics_name or digest_label(admitted.ticket.admission.tenant),
        input_tokens=admitted.prompt_tokens, output_tokens=admitted.output_tokens, duration_s=ended - admitted.started,
        first_token_s=None if admitted.first_token_at is None else admitted.first_token_at - admitted.started,
        error_type=None if outcome == "completed" else error_code or outcome,
    )
    decision = admitted.judgement.decision
    target = admitted.deployment
    max_tokens = admitted.params.max_tokens if admitted.params is not None else 0  # embeddings sample nothing
    record = {
        "decision_id": admitted.decision_id,
        "request_id": admitted.request_id,
        "route": admitted.route,
        **gateway.audit.principal_digests(admitted.principal),
        "policy_revision": admitted.judgement.revision,
        "decision": decision_summary(decision) | {"max_tokens": max_tokens},
        "model": admitted.ask.model,
        "deployment": target.name if target is not None else None,
        "model_fingerprint": target.fingerprint if target is not None else None,
        "usage": {"prompt_tokens": admitted.prompt_tokens, "completion_tokens": admitted.output_tokens,
                  "cached_tokens": admitted.cached_tokens},
        "finish_reason": admitted.finish_reason,
        "latency_ms": round((ended - admitted.started) * 1000, 3),
        "status": status,
        "outcome": outcome,
    }
    if error_code is not None:
        record["error_code"] = error_code
    if admitted.usage_excess:
        # What the deployment reported beyond the request's bounds (the usage above is what was charged).
        record["usage_excess"] = dict(admitted.usage_excess)
        for kind, tokens in admitted.usage_excess.items():
            gateway.metrics.deployment_usage_excess.labels(target.name if target is not None else "none",
                                                           kind).inc(tokens)
    if admitted.keeps_content:
        response = "".join(admitted.texts or ())
        if admitted.later_choice_texts:
            later = admitted.later_choice_texts
            response = [response, *("".join(later.get(i, ())) for i in range(1, admitted.ask.n))]
        content = gateway.audit.content(decision, admitted.ask.body, response)
        if content is not None:
            record["content"] = content
    admitted.trace.set({
        "gen_ai.response.id": admitted.request_id, "gen_ai.response.model": admitted.ask.model,
        "gen_ai.usage.input_tokens": admitted.prompt_tokens, "gen_ai.usage.output_tokens": admitted.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": admitted.cached_tokens,
        "gen_ai.response.finish_reasons": [admitted.finish_reason] if admitted.finish_reason else None,
        "tenantgate.deployment": target.name if target is not None else None,
    })
    span = admitted.trace.start("audit")
    written = gateway.audit.write_after_engine(target, admitted.request_id, record)
    if written is None:
        span.end()
    else:
        written.add_done_callback(lambda _: span.end())  # the record waits for the engine's x-record
    return written


async def recorded(written: asyncio.Task | None) -> None:
    """Waits until finish()'s audit record is in the trail. A success is answered only after
    this: a gateway killed between the answer and the write would leave an acknowledged request
    without its record. Raises AuditUnavailable when the trail could not keep the record: then
    the answer is a 503, never the success. Shielded, so a caller who goes meanwhile can't
    cancel the write."""
    if written is not None:
        await asyncio.shield(written)
