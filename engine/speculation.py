"""Prompt-lookup (n-gram) speculative decoding: drafts from the request's own tokens.

A request that edits, quotes or summarises its prompt repeats runs of it. When the last n
tokens (n from MAX_NGRAM down to 1) occurred earlier in the prompt or the output, the tokens
that followed that occurrence are a cheap guess at what comes next. The scheduler runs the
guess (the draft) beside the sequence's next token in one step, 1 + k rows like a small
prefill chunk; the sampler keeps the longest prefix the model agrees with, plus the token the
model chose where it stopped agreeing (docs/engine.md, "Speculative decoding").

Only requests whose output can be kept exactly as without a draft speculate (may_speculate).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.sequence import Sequence

MAX_NGRAM = 3
MIN_NGRAM = 1


def propose_draft(token_ids: Seq[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens, for the
    longest n in [min_ngram, max_ngram] that has one; [] when none has."""
    length = len(token_ids)
    if k <= 0:
        return []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = list(token_ids[length - n:])
        last = suffix[-1]
        # Latest start first; the occurrence must end before the suffix itself ends.
        for start in range(length - n - 1, -1, -1):
            if token_ids[start + n - 1] == last and list(token_ids[start:start + n]) == suffix:
                return list(token_ids[start + n:start + n + k])
    return []


def may_speculate(seq: Sequence) -> bool:
    """Whether a draft can run for seq without changing what it outputs.

    Skipped, because the draft's later rows would need state this step does not have yet, or the
    output would differ from the request run without one:
    - the deterministic lane: its proof of batch invariance covers one-token decode steps only;
    - structured outputs: each draft row needs the grammar advanced over the draft before it;
    - presence/frequency penalties: each row needs the counts of the drafts before it;
    - logit_bias, logprobs and keep_logits: possible, but not handled (logprobs per accepted token);
    - a seed with temperature > 0: a seed promises the tokens it drew without a draft, and
      verification draws other uniforms than sampling does;
    - n > 1: the choices fork from one prompt and decode as a batch, not a single stream.
    """
    p = seq.params
    return (
        seq.envelope.speculative
        and not seq.envelope.deterministic
        and seq.grammar is None
        and p.json_schema is None
        and p.n == 1
        and len(seq.choices) == 1
        and not p.penalized
        and not p.logit_bias
        and p.logprobs is None
        and not p.keep_logits
        and (p.greedy or p.seed is None)
    )
