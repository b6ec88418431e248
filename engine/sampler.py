"""Token selection: greedy, temperature, top-k, top-p, per-request seeds, OpenAI-style logprobs.

Each sampled request draws its noise from its own torch.Generator, one vector of
vocabulary size per step, so the tokens a seed yields do not depend on what else is
in the batch. Logprobs are taken from the raw model distribution (before temperature
and truncation), as OpenAI and vLLM report them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), best first


@dataclass(frozen=True)
class SampleResult:
    token_id: int
    logprobs: TokenLogprobs | None
    logits: torch.Tensor | None = None  # raw float32 row, only with SamplingParams.keep_logits
    margin: float = 0.0  # top-1 minus top-2 raw logit: how close the step was to a tie


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
    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[SampleResult]:
        """logits: [num_rows, vocab] float32, one row per request that samples this step."""
        logits = logits.float()
        chosen = logits.argmax(dim=-1)
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows:
            rows = torch.tensor(sampled_rows, device=logits.device)
            probs = self._probabilities(logits[rows], [params[i] for i in sampled_rows])
            # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
            noise = torch.stack(
                [
                    torch.empty(logits.shape[-1]).exponential_(generator=self.generator_for(request_ids[i], params[i]))
                    for i in sampled_rows
                ]
            ).to(logits.device)
            chosen[rows] = (probs / noise).argmax(dim=-1)

        chosen_ids = chosen.tolist()
        top2 = logits.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        want_logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
        logprobs: dict[int, TokenLogprobs] = {}
        if want_logprobs:
            rows = torch.tensor(want_logprobs, device=logits.device)
            lp = torch.log_softmax(logits[rows], dim=-1)
            k = max(params[i].logprobs for i in want_logprobs)
            top_vals, top_ids = lp.topk(max(k, 1), dim=-1)
            chosen_lp = lp.gather(1, chosen[rows].unsqueeze(1)).squeeze(1).tolist()
            top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
            for j, i in enumerate(want_logprobs):
                n = params[i].logprobs
                top = tuple(zip(top_ids[j][:n], top_vals[j][:n]))
                logprobs[i] = TokenLogprobs(chosen_ids[i], chosen_lp[j], top)
        return [
            SampleResult(tok, logprobs.get(i), logits[i].cpu().clone() if params[i].keep_logits else None, margins[i])
            for i, tok in enumerate(chosen_ids)
        ]

    @staticmethod
    def _probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        temps = torch.tensor([p.temperature for p in params], device=logits.device)[:, None]
        logits = logits / temps
        vocab = logits.shape[-1]
        top_ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_ps = [p.top_p for p in params]
        if any(k < vocab for k in top_ks) or any(p < 1 for p in top_ps):
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=logits.device)[None, :]
            drop = ranks >= torch.tensor(top_ks, device=logits.device)[:, None]
            sorted_probs = sorted_logits.softmax(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop |= mass_before >= torch.tensor(top_ps, device=logits.device)[:, None]
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        return logits.softmax(dim=-1)
