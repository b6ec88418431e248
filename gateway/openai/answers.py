"""Shared pieces of the OpenAI response bodies: usage, logprobs and server-sent events."""

from __future__ import annotations

import json

from engine import CacheScope, RequestOutput, TokenLogprobs
from gateway.pipeline.admission import Admitted

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def usage(admitted: Admitted) -> dict:
    prompt = admitted.prompt_tokens
    # In the shared scope a hit may come from another tenant's prompt: reporting it would tell the
    # caller what others sent. The audit record keeps the real figure.
    shared = admitted.envelope.cache_scope is CacheScope.SHARED
    return {
        "prompt_tokens": prompt,
        "completion_tokens": admitted.output_tokens,
        "total_tokens": prompt + admitted.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0 if shared else admitted.cached_tokens},
    }


def finish_reason(reason: str | None) -> str | None:
    # The engine's "abort" never reaches a caller that is still listening, except at shutdown.
    return "stop" if reason == "abort" else reason


def system_fingerprint(admitted: Admitted) -> str:
    """The fingerprint of the target that answered (before the first output: the first choice)."""
    target = admitted.deployment or admitted.targets[0]
    return "fp_" + target.fingerprint[:12]


def chat_logprobs(token_text, logprobs: list[TokenLogprobs]) -> list[dict]:
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, p) for t, p in lp.top]}
        for lp in logprobs
    ]


def completion_logprobs(token_text, logprobs: list[TokenLogprobs], text_offset: int) -> dict:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        tops.append({token_text(t): p for t, p in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def joined(outputs: list[RequestOutput]) -> tuple[str, list[TokenLogprobs]]:
    return "".join(o.new_text for o in outputs), [lp for o in outputs for lp in o.logprobs]


def joined_by_choice(outputs: list[RequestOutput], n: int) -> list[tuple[str, list[TokenLogprobs]]]:
    """Each choice's text and logprobs, in choice order (joined, for n choices)."""
    return [joined([o for o in outputs if o.index == index]) for index in range(n)]
