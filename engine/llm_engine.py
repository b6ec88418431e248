"""LLMEngine: add requests, step, abort. One step = schedule -> run (forward, sample) -> postprocess -> record."""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from collections import defaultdict
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.block_manager import BlockManager, KVStats, public_prefix
from engine.config import EngineConfig, ModelConfig
from engine.envelope import ExecutionEnvelope
from engine.errors import ConfigError, RequestError, WeightsError
from engine.fingerprint import file_digest, model_fingerprint
from engine.grammar import Grammars
from engine.model.catalog import resolve_model_path
from engine.model.loader import weight_files
from engine.model.quant import QUANTIZED_FILE
from engine.model_runner import (
    ModelRunner,
    kv_bytes_per_block,
    resolve_device,
    resolve_dtype,
    return_freed_memory,
    start_quantized_kernels,
)
from engine.outputs import CompletedRequest, RequestOutput
from engine.sampler import SampleResult
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import FinishReason, Sequence
from engine.telemetry import NUM_MARGIN_STEPS, Recorder, RecordSink
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

if TYPE_CHECKING:
    import llguidance

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: bool = False, sinks: Seq[RecordSink] = ()) -> None:
        self.config = config
        self.sinks = list(sinks)  # the recorder's: a sink appended here gets the records that follow
        start_quantized_kernels(config)  # built while the GGUF file converts; the runner waits for them
        self.model_path: Path = resolve_model_path(config.model, progress=progress)
        self.model_config = ModelConfig.from_dir(self.model_path)
        self.tokenizer = Tokenizer.from_dir(self.model_path)
        mc = self.model_config
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        block_bytes = kv_bytes_per_block(mc, config.block_size, dtype)
        num_blocks = config.num_kv_blocks or config.kv_cache_memory_bytes // block_bytes
        self.max_model_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        # With gpu_memory_utilization, a CUDA pool takes what is left once the model is loaded and warmed up.
        size_from_device = (device.type == "cuda" and config.num_kv_blocks is None
                            and config.gpu_memory_utilization is not None)
        self.eos_token_ids = frozenset(mc.eos_token_ids) | self.tokenizer.eos_token_ids
        # Structured outputs: the end of a schema's JSON allows only the end of text (the first EOS id).
        self.grammars = Grammars(self.tokenizer, mc.vocab_size, min(self.eos_token_ids, default=None),
                                 compile_timeout_s=config.grammar_compile_timeout_s,
                                 compile_workers=config.grammar_workers, cache_size=config.grammar_cache_size)
        # The weight files are hashed (for the fingerprint) while a first start's kernel build finishes.
        weight_digests: dict[Path, str] = {}
        hash_weights = functools.partial(_hash_weight_files, self.model_path, weight_digests)
        if size_from_device:
            self.runner = ModelRunner(mc, config, self.model_path, self.max_model_len, None, progress=progress,
                                      grammars=self.grammars, before_kernels=hash_weights)
            num_blocks = self.runner.num_blocks
        if config.max_model_len is None and num_blocks * config.block_size < self.max_model_len:
            # Nobody asked for the model's whole context: serve what the KV cache holds rather than refuse.
            self.max_model_len = num_blocks * config.block_size
            logger.info("max_model_len %d: what the KV cache holds (the model allows %d)",
                        self.max_model_len, mc.max_position_embeddings)
        if num_blocks * config.block_size < self.max_model_len:
            needed = config.blocks_for(self.max_model_len) * block_bytes
            budget = (f"raise gpu_memory_utilization (the pool needs {needed} bytes)" if size_from_device
                      else f"raise kv_cache_memory_bytes to at least {needed}")
            raise ConfigError(
                f"the KV cache holds {num_blocks * config.block_size} tokens ({num_blocks} blocks of "
                f"{config.block_size}), fewer than one sequence of max_model_len={self.max_model_len}; "
                f"{budget} or lower max_model_len"
            )
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            raise ConfigError("without chunked prefill, max_num_batched_tokens must be at least max_model_len")

        if not size_from_device:
            self.runner = ModelRunner(mc, config, self.model_path, self.max_model_len, num_blocks, progress=progress,
                                      grammars=self.grammars, before_kernels=hash_weights)
        self.runner.prepare_decode_graphs()
        files = weight_files(self.model_path)
        if self.runner.weights != "dequantized":
            files.append(self.model_path / QUANTIZED_FILE)
        self.fingerprint = model_fingerprint(
            files, self.tokenizer.digest(), mc, str(self.runner.dtype).removeprefix("torch."), self.runner.weights,
            digests=weight_digests,
        )
        self.scheduler = Scheduler(config, BlockManager(num_blocks, config.block_size, self.fingerprint))
        self.recorder = Recorder(self.sinks, config.record_key or os.urandom(32), self.fingerprint,
                                 config.block_size)
        self._arrivals = itertools.count()
        if self.runner.device.type == "cpu":
            return_freed_memory()
        logger.info(
            "engine ready: %s on %s, weights %s, %d KV blocks of %d tokens, fingerprint %s",
            mc.architecture, self.runner.device, self.runner.weights, num_blocks, config.block_size,
            self.fingerprint[:16],
        )

    # -- requests -----------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | Seq[int],
        params: SamplingParams,
        envelope: ExecutionEnvelope,
        add_special_tokens: bool = True,
    ) -> Sequence:
        seq = self.make_sequence(request_id, prompt, params, envelope, add_special_tokens)
        self.enqueue(seq)
        return seq

    def make_sequence(
        self,
        request_id: str,
        prompt: str | Seq[int],
        params: SamplingParams,
        envelope: ExecutionEnvelope,
        add_special_tokens: bool = True,
        grammar: Any = None,
    ) -> Sequence:
        """Validate and tokenize a request without touching engine state (safe from any thread).
        `grammar`: params.json_schema compiled already (Grammars.compile_async); else it is compiled
        here, on this thread."""
        if not isinstance(envelope, ExecutionEnvelope):
            raise RequestError("a request needs an execution envelope from the policy decision", param="envelope")
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            token_ids = list(prompt)
            vocab = self.model_config.vocab_size
            if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in token_ids):
                raise RequestError(f"prompt token ids must be integers in [0, {vocab})", param="prompt")
        if not token_ids:
            raise RequestError("the prompt is empty", param="prompt")
        vocab = self.model_config.vocab_size
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:  # sorted by id
            raise RequestError(f"logit_bias: token id {params.logit_bias[-1][0]} is not in this model's "
                               f"vocabulary (ids 0 to {vocab - 1})", param="logit_bias")
        if len(token_ids) >= self.max_model_len:
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens; this model's context is {self.max_model_len} tokens "
                "including at least one generated token",
                param="prompt",
                code="context_length_exceeded",
            )
        if params.n > self.config.max_num_seqs:
            raise RequestError(f"n may be at most {self.config.max_num_seqs} here (the engine's max_num_seqs)",
                               param="n")
        # The choices share the prompt's full blocks, up to where the prefix cache would match.
        fork_at = (len(token_ids) - 1) // self.config.block_size * self.config.block_size if params.n > 1 else 0
        shared = fork_at // self.config.block_size
        per_choice = self.config.blocks_for(min(len(token_ids) + params.max_tokens, self.max_model_len)) - shared
        worst_case = shared + params.n * per_choice
        if worst_case > envelope.kv_block_quota:
            raise RequestError(
                f"the request may need {worst_case} KV blocks, more than the tenant's quota "
                f"of {envelope.kv_block_quota}; lower max_tokens" + (" or n" if params.n > 1 else ""),
                param="max_tokens",
            )
        arrival = next(self._arrivals)
        raw_digest = self.recorder.prompt_digest(prompt if isinstance(prompt, str) else token_ids)
        seq = Sequence(request_id, token_ids, params, self.max_model_len, arrival, envelope)
        for index in range(1, params.n):
            seq.choices.append(Sequence(request_id, token_ids, params.for_choice(index), self.max_model_len,
                                        arrival, envelope, choice_index=index))
        segment, public_blocks = public_prefix(envelope, token_ids, self.config.block_size)
        grammars: Seq[llguidance.LLMatcher | None] = [None] * len(seq.choices)
        if params.json_schema is not None:
            grammar = grammar or self.grammars.compile(params.json_schema, envelope)
            grammars = self.grammars.matchers(grammar, len(seq.choices))
        for choice, grammar in zip(seq.choices, grammars):
            choice.choices = seq.choices
            choice.fork_at = fork_at
            choice.raw_prompt_digest = raw_digest
            choice.detokenizer = IncrementalDetokenizer(self.tokenizer, choice.params.stop,
                                                        choice.params.skip_special_tokens)
            choice.grammar = grammar
            choice.public_segment, choice.num_public_blocks = segment, public_blocks
        return seq

    def enqueue(self, seq: Sequence) -> None:
        if self.scheduler.find(seq.request_id) is not None:
            raise RequestError(f"request id {seq.request_id!r} is already in flight", param="request_id")
        self.scheduler.add(seq)
        if seq.num_pending_forks and seq.fork_at == 0:  # no full block to share: the choices start apart
            seq.num_pending_forks = 0
            for child in seq.choices[1:]:
                self.scheduler.add(child)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its KV blocks; returns its final (empty) delta (of its
        first unfinished choice), None if not in flight. abort_choices gives every choice's."""
        finals = self.abort_choices(request_id)
        return finals[0] if finals else None

    def abort_choices(self, request_id: str) -> list[RequestOutput]:
        """Stop every choice of a request now; one final (empty) delta per choice that had not finished."""
        seq = self.scheduler.find(request_id)
        if seq is None:
            return []
        finals = []
        for choice in seq.choices:
            if choice.is_finished:
                continue
            self.scheduler.finish(choice, FinishReason.ABORT)
            self.runner.release(choice.seq_id)
            finals.append(RequestOutput(
                request_id=request_id,
                new_token_ids=[],
                new_text="",
                num_prompt_tokens=choice.num_prompt_tokens,
                num_output_tokens=choice.num_output_tokens,
                num_cached_tokens=choice.num_cached_tokens,
                finished=True,
                finish_reason=FinishReason.ABORT.value,
                index=choice.choice_index,
            ))
        self.recorder.request(seq)
        seq.release_choices()
        return finals

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- stepping -----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        start = time.monotonic()
        results = self.runner.run(batch)  # the forward pass, then the sampler
        end = time.monotonic()
        self.scheduler.advance(batch, start, end, [len(r.accepted) if r is not None else 0 for r in results])
        outputs = self._postprocess(batch, results)
        self.recorder.step(batch, (end - start) * 1000, self.scheduler)
        return outputs

    def _postprocess(self, batch: ScheduledBatch, results: list[SampleResult | None]) -> list[RequestOutput]:
        outputs = []
        for seq, result in zip(batch.seqs, results):
            if result is None:
                continue
            # A verified draft: its accepted tokens joined the sequence already (Scheduler.advance);
            # they count here one by one, as if each had had its own step, and the first that ends
            # the request drops the rest.
            del seq.token_ids[seq.num_tokens - len(result.accepted):]
            text = ""
            new_token_ids = []
            reason: FinishReason | None = None
            for sample in (*result.accepted, result):
                token = sample.token_id
                seq.append_token(token)
                new_token_ids.append(token)
                if seq.grammar is not None:
                    seq.grammar.consume_token(token)
                if seq.first_token_time is None:
                    seq.first_token_time = time.monotonic()
                if len(seq.top_margins) < NUM_MARGIN_STEPS:
                    seq.top_margins.append(round(sample.margin, 6))
                text += seq.detokenizer.add(token)
                reason = self._finish_reason(seq, token)
                if reason is not None:
                    break
            if reason is not None:
                if not seq.detokenizer.stopped:
                    text += seq.detokenizer.flush()
                self.scheduler.finish(seq, reason)
                self.runner.release(seq.seq_id)
                self.recorder.request(seq)
                seq.release_choices()
            outputs.append(
                RequestOutput(
                    request_id=seq.request_id,
                    new_token_ids=new_token_ids,
                    new_text=text,
                    num_prompt_tokens=seq.num_prompt_tokens,
                    num_output_tokens=seq.num_output_tokens,
                    num_cached_tokens=seq.num_cached_tokens,
                    finished=reason is not None,
                    finish_reason=reason.value if reason else None,
                    logprobs=[result.logprobs] if result.logprobs else [],
                    logits=[result.logits] if result.logits is not None else [],
                    index=seq.choice_index,
                )
            )
        return outputs

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return FinishReason.STOP
        if seq.detokenizer.stopped:
            return FinishReason.STOP
        if seq.grammar is not None and (seq.grammar.is_stopped() or seq.grammar.is_error()):
            # The JSON is complete and nothing may follow it (an error cannot happen under the mask;
            # stopping is the safe answer if it does).
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= seq.max_total_tokens:
            return FinishReason.LENGTH
        return None

    # -- conveniences ---------------------------------------------------------------

    def generate(
        self,
        prompts: Seq[str | Seq[int]],
        params: SamplingParams | Seq[SamplingParams],
        envelopes: ExecutionEnvelope | Seq[ExecutionEnvelope],
        add_special_tokens: bool = True,
    ) -> list[CompletedRequest]:
        """Run prompts to completion; results come back in prompt order (a prompt's n choices in choice order)."""
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        envelope_list = [envelopes] * len(prompts) if isinstance(envelopes, ExecutionEnvelope) else list(envelopes)
        if not len(params_list) == len(envelope_list) == len(prompts):
            raise RequestError(
                f"{len(prompts)} prompts, {len(params_list)} sampling params, {len(envelope_list)} envelopes",
                param="params",
            )
        ids = [f"generate-{next(self._arrivals)}" for _ in prompts]
        # Validate every prompt before queueing any, so a bad one leaves nothing behind.
        seqs = [
            self.make_sequence(i, prompt, p, e, add_special_tokens)
            for i, prompt, p, e in zip(ids, prompts, params_list, envelope_list)
        ]
        for seq in seqs:
            self.enqueue(seq)
        deltas: dict[tuple[str, int], list[RequestOutput]] = defaultdict(list)
        while self.has_unfinished_requests():
            for out in self.step():
                deltas[out.request_id, out.index].append(out)
        return [CompletedRequest.from_deltas(deltas[i, choice]) for i, seq in zip(ids, seqs)
                for choice in range(seq.params.n)]

    def kv_stats(self) -> KVStats:
        return self.scheduler.kv_stats()

    def kv_usage(self) -> float:
        """The share of KV blocks held by requests; safe to read while the engine steps."""
        return self.scheduler.kv_usage()

    def peak_kv_stats(self) -> KVStats:
        """Usage at the step that held the most blocks so far."""
        return self.scheduler.peak_kv_stats()

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()


def _hash_weight_files(model_path: Path, digests: dict[Path, str]) -> None:
    """file_digest of each weight file into digests; none where the checkpoint names none (the runner says so).
    Run by the runner after it tunes the C allocator, as the fingerprint's own hashing was: the
    read buffers then stay in the heap (tests/engine/remote/test_edge.py's memory bounds see that)."""
    try:
        files = weight_files(model_path)
    except WeightsError:
        return
    digests.update((f, file_digest(f)) for f in files)
