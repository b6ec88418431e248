"""Token selection: logit bias, presence and frequency penalties, greedy, temperature, top-k,
top-p, min-p, per-request seeds, OpenAI-style logprobs.

The order is HF transformers': processors on the raw logits (logit_bias, then OpenAI's
penalties), which greedy decoding sees too; then the grammar masks of structured outputs
(engine/grammar.py: -inf for every token the request's schema does not allow next); then, for
sampled rows, temperature, top-k, top-p on what top-k kept, and min-p. Each is one tensor op
over the whole batch and touches a row only through that row's own values, so a row's result
does not depend on its batch (the deterministic lane relies on it).

Each sampled request draws one uniform per step from its own torch.Generator and picks
its token by inverse CDF, so the tokens a seed yields do not depend on what else is in the
batch. Logprobs are taken from the raw model distribution (before bias, penalties,
temperature and truncation), as vLLM reports them by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.grammar import apply_bitmask
from engine.outputs import TokenLogprobs
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleResult:
    token_id: int
    logprobs: TokenLogprobs | None
    logits: torch.Tensor | None = None  # raw float32 row, only with SamplingParams.keep_logits
    # top-1 minus top-2 logit after bias and penalties, before a grammar mask: how close the step was to a tie
    margin: float = 0.0
    # Speculation: the draft tokens accepted before this token, each with its margin (Sampler.verify)
    accepted: tuple[SampleResult, ...] = ()


class Sampler:
    def __init__(self, seed: int) -> None:
        self._seed_source = torch.Generator().manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}

    def generator_for(self, request_id: str, params: SamplingParams) -> torch.Generator:
        gen = self._generators.get(request_id)
        if gen is None:
            seed = params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            gen = self._generators[request_id] = torch.Generator().manual_seed(seed)
        return gen

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams],
               output_token_ids: list[list[int]] | None = None,
               masks: tuple[list[int], torch.Tensor] | None = None) -> list[SampleResult]:
        """logits: [num_rows, vocab] float32, one row per request that samples this step;
        output_token_ids: per row, the tokens it generated so far (read only for penalized rows);
        masks: the rows with a grammar and their bitmask, one row each (Grammars.bitmask)."""
        logits = logits.float()
        processed = process_logits(logits, params, output_token_ids)
        top2 = processed.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        if masks is not None:
            rows, bitmask = masks
            if processed is logits:  # never mask the raw logits (logprobs and keep_logits read them)
                processed = logits.clone()
            if len(rows) == len(params):
                apply_bitmask(processed, bitmask)
            else:
                index = torch.tensor(rows, device=logits.device)
                processed[index] = apply_bitmask(processed[index], bitmask)
        chosen = processed.argmax(dim=-1)
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows:
            sampled = torch.tensor(sampled_rows, device=logits.device)
            probs = warp_logits(processed[sampled], [params[i] for i in sampled_rows]).softmax(dim=-1)
            uniforms = torch.stack(
                [torch.rand((), generator=self.generator_for(request_ids[i], params[i])) for i in sampled_rows]
            ).to(logits.device)
            chosen[sampled] = inverse_cdf(probs, uniforms)

        chosen_ids = chosen.tolist()
        want_logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
        logprobs: dict[int, TokenLogprobs] = {}
        if want_logprobs:
            wanted = torch.tensor(want_logprobs, device=logits.device)
            lp = torch.log_softmax(logits[wanted], dim=-1)
            k = max(params[i].logprobs or 0 for i in want_logprobs)  # each is set (want_logprobs)
            best = lp.topk(max(k, 1), dim=-1)
            chosen_lp = lp.gather(1, chosen[wanted].unsqueeze(1)).squeeze(1).tolist()
            top_vals, top_ids = best.values.tolist(), best.indices.tolist()
            for j, i in enumerate(want_logprobs):
                n = params[i].logprobs
                top = tuple(zip(top_ids[j][:n], top_vals[j][:n]))
                logprobs[i] = TokenLogprobs(chosen_ids[i], chosen_lp[j], top)
        return [
            SampleResult(tok, logprobs.get(i), logits[i].cpu().clone() if params[i].keep_logits else None, margins[i])
            for i, tok in enumerate(chosen_ids)
        ]


    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, draft: list[int], request_id: str,
               params: SamplingParams) -> SampleResult:
        """The tokens a draft yields: logits [1 + k, vocab], row j the model's distribution after the
        draft's first j tokens. Greedy: the longest prefix of the draft that is the argmax at each
        row, then the argmax where it stops. Sampled: draft token j is accepted with probability
        p_j(d_j) under the warped distribution; on rejection the token comes from p_j with d_j
        removed (renormalised), and after a whole accepted draft from p_k. That is speculative
        sampling with a draft distribution that is all on d_j (Leviathan et al., 2023), so each
        token is distributed as sampling it alone would be. Only requests without bias, penalties,
        grammar or logprobs verify (engine/speculation.py)."""
        logits = logits.float()
        top2 = logits.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        if params.greedy:
            chosen = logits.argmax(dim=-1).tolist()
            accepted = 0
            while accepted < len(draft) and chosen[accepted] == draft[accepted]:
                accepted += 1
            token = chosen[accepted]
        else:
            probs = warp_logits(logits, [params] * len(logits)).softmax(dim=-1)
            gen = self.generator_for(request_id, params)
            accepted, token = 0, -1
            for j, d in enumerate(draft):
                if float(torch.rand((), generator=gen)) < float(probs[j, d]):
                    accepted += 1
                    continue
                residual = probs[j].clone()
                residual[d] = 0
                if not float(residual.sum()) > 0:  # p(d) rounded to just below 1: nothing else to draw
                    accepted += 1
                    continue
                token = int(inverse_cdf(residual[None], torch.rand((1,), generator=gen))[0])
                break
            else:
                token = int(inverse_cdf(probs[-1:], torch.rand((1,), generator=gen))[0])
        kept = tuple(SampleResult(d, None, None, margins[j]) for j, d in enumerate(draft[:accepted]))
        return SampleResult(token, None, None, margins[accepted], kept)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token whose slice of [0, total) holds uniforms[row] * total, per row: a draw from
    probs with one uniform each. (An exponential race, argmax(p / E), needs a vocabulary of
    draws per row: 30 ms a step at 32 rows of 49,152 here, against well under 1 ms.) A
    row's cumulative sum runs in order within the row, so its draw does not depend on the
    batch; tokens of zero probability have empty slices and are never chosen."""
    cdf = probs.cumsum(dim=-1)
    targets = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    chosen = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    # Rounding can put a target at the total itself: take the last token with any probability.
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.minimum(chosen, last)


def process_logits(logits: torch.Tensor, params: list[SamplingParams],
                   output_token_ids: list[list[int]] | None = None) -> torch.Tensor:
    """logit_bias, then OpenAI's presence and frequency penalties over the tokens generated so
    far: logits[j] += bias[j] - count[j] * frequency_penalty - (count[j] > 0) * presence_penalty.
    Returns `logits` itself when no row asks for either (no copy, no rounding)."""
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    penalized = [i for i, p in enumerate(params) if p.penalized]
    if not biased and not penalized:
        return logits
    logits = logits.clone()
    device = logits.device
    if biased:
        rows = [i for i in biased for _ in params[i].logit_bias]
        tokens = [t for i in biased for t, _ in params[i].logit_bias]
        biases = [b for i in biased for _, b in params[i].logit_bias]
        index = (torch.tensor(rows, device=device), torch.tensor(tokens, device=device))
        logits.index_put_(index, torch.tensor(biases, dtype=logits.dtype, device=device), accumulate=True)
    if penalized:
        if output_token_ids is None:
            raise ValueError("presence and frequency penalties need the tokens generated so far")
        # Counts are small integers and each (row, token) of logit_bias is unique, so neither
        # scatter depends on the order a device adds in.
        outputs = [output_token_ids[i] for i in penalized]
        index = (torch.tensor([r for r, out in enumerate(outputs) for _ in out], dtype=torch.long, device=device),
                 torch.tensor([t for out in outputs for t in out], dtype=torch.long, device=device))
        counts = torch.zeros(len(penalized), logits.shape[-1], dtype=logits.dtype, device=device)
        counts.index_put_(index, torch.ones(index[0].shape, dtype=logits.dtype, device=device), accumulate=True)
        penalties = [[params[i].frequency_penalty, params[i].presence_penalty] for i in penalized]
        frequency, presence = torch.tensor(penalties, dtype=logits.dtype, device=device).unbind(dim=1)
        penalized_rows = torch.tensor(penalized, device=device)
        logits[penalized_rows] -= counts * frequency[:, None] + (counts > 0).to(logits.dtype) * presence[:, None]
    return logits


def warp_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p over what top-k kept, then min-p, as HF's warpers chain them:
    the logits with every dropped token at -inf (the top token always stays)."""
    device = logits.device
    logits = logits / torch.tensor([p.temperature for p in params], device=device)[:, None]
    vocab = logits.shape[-1]
    top_ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_ps = [p.top_p for p in params]
    if any(k < vocab for k in top_ks) or any(p < 1 for p in top_ps):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        sorted_logits = sorted_logits.masked_fill(ranks >= torch.tensor(top_ks, device=device)[:, None],
                                                  float("-inf"))
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # A row at top_p 1 drops nothing: its mass before the tail can round up to 1 in float32.
        reach = torch.tensor([p if p < 1 else float("inf") for p in top_ps], device=device)
        drop = mass_before >= reach[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    min_ps = [p.min_p for p in params]
    if any(m > 0 for m in min_ps):
        probs = logits.softmax(dim=-1)
        floor = torch.tensor(min_ps, device=device)[:, None] * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits
