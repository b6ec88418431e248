"""The engines in this process, each a deployment target itself: the embedded decode engine,
the embedded sentence encoder, or a null engine.

The null engine streams fixed tokens with no model; `bench/gateway_overhead.py` puts
the whole gateway in front of it to measure what the gateway itself costs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from engine import (
    EncoderError,
    ExecutionEnvelope,
    PendingRecords,
    RequestError,
    RequestOutput,
    SamplingParams,
    StepHistory,
)
from gateway.deployments.base import Embeddings, ReplicaLoad, RunRequest


class InferenceBackend(Protocol):
    model_name: str  # the name callers use in "model"
    fingerprint: str
    max_model_len: int
    expects_records: bool  # whether engine_record() will see an x-record for each request
    steps: StepHistory | None  # the engine's recent steps, for the operator console (None: no engine runs)

    # parse_special: read special-token strings in text as those tokens (only when the decision allows it).
    def encode(self, text: str, add_special_tokens: bool, parse_special: bool = False) -> list[int]: ...
    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...
    def generate(self, token_ids: Sequence[int], params: SamplingParams, envelope: ExecutionEnvelope,
                 request_id: str) -> AsyncIterator[RequestOutput]: ...
    def engine_record(self, request_id: str): ...  # the engine's x-record once the request ended, once
    def ready(self) -> bool: ...
    async def start(self) -> None: ...
    async def aclose(self) -> None: ...


class InProcessTarget:
    """An engine in this process as a deployment target (gateway/deployments/routing.py's Target).
    Its scheduler honours every isolation, cache scope and lane itself, so no decision is unmet.
    The app closes it where the app built it (a test's may outlive its app), never as a target."""

    name: str = "embedded"  # its deployment's name (gateway/deployments/registry.py names it)
    remote: bool = False  # its span is the engine's, in this process

    def unmet(self, envelope: ExecutionEnvelope, tenant_id: str) -> str | None:
        return None

    def reported_load(self) -> ReplicaLoad | None:
        return None

    def generate(self, token_ids: Sequence[int], params: SamplingParams, envelope: ExecutionEnvelope,
                 request_id: str) -> AsyncIterator[RequestOutput]:
        raise RequestError("this engine does not generate", param="model")

    def run(self, request: RunRequest) -> AsyncIterator[RequestOutput]:
        """A generating engine's outputs for the request (its generate())."""
        if request.params is None:
            raise RequestError("this model embeds; it does not generate", param="model")
        return self.generate(request.token_ids, request.params, request.envelope, request.request_id)


class GatewayTokenizer:
    """An engine Tokenizer with the calls the gateway makes (chat ends with the assistant's prompt)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens, parse_special=parse_special)

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template has a tools section (else tool calling writes its own system message)."""
        return self._tokenizer.renders_tools

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self._tokenizer.encode_chat(messages, add_generation_prompt=True, tools=tools)

    def token_text(self, token_id: int) -> str:
        return self._tokenizer.token_text(token_id)


class EngineBackend(InProcessTarget, GatewayTokenizer):
    """The embedded decode engine, stepped on its own thread (AsyncLLMEngine)."""

    def __init__(self, engine, *, model_name: str) -> None:
        from engine import AsyncLLMEngine

        self.engine = engine
        self.async_engine = AsyncLLMEngine(engine)
        self.model_name = model_name
        self.fingerprint = engine.fingerprint
        self.max_model_len = engine.max_model_len
        self._tokenizer = engine.tokenizer
        self.expects_records = True
        self._records = PendingRecords()
        self.steps: StepHistory | None = StepHistory()  # the operator console's regime timeline and KV by tenant
        engine.sinks += [self._records, self.steps]

    def engine_record(self, request_id: str):
        return self._records.pop(request_id)

    def generate(self, token_ids, params, envelope, request_id):
        return self.async_engine.generate(list(token_ids), params, envelope, request_id=request_id)

    def ready(self) -> bool:
        return self.async_engine.is_running

    async def start(self) -> None:
        self.async_engine.start()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.async_engine.shutdown)


class EncoderBackend(InProcessTarget):
    """The embedded sentence encoder (engine/encoder) behind an AsyncEncoder: its worker thread
    runs steps of a few inputs' tokens each, filled fairly across tenants, so the event loop never
    waits on torch and no tenant waits for another's whole batch. Only requests that may share
    (the envelope's isolation and deterministic lane) share a step, and no state outlives a request."""

    expects_records: bool = False
    max_model_len: int | None = None  # each input is cut at the encoder's own length instead

    def __init__(self, encoder, *, model_name: str) -> None:
        from engine import AsyncEncoder

        self.encoder = encoder
        self.async_encoder = AsyncEncoder(encoder)
        self.model_name = model_name
        self.fingerprint = encoder.fingerprint
        self.dimensions = encoder.dimensions

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.encoder.tokenize(texts)

    async def embed(self, request: RunRequest) -> Embeddings:
        """Unit vectors, one float32 row per input, and the inputs' token count."""
        dimensions = request.body.get("dimensions")
        if dimensions is not None and dimensions != self.dimensions:
            raise RequestError(f"dimensions must be {self.dimensions} for this model "
                               "(it has no shortened embeddings)", param="dimensions")
        inputs = request.embed_inputs
        if inputs is None:  # the service tokenizes every input for the embedded encoder
            raise RequestError("the inputs were not tokenized for this encoder", param="input")
        try:
            vectors = await self.async_encoder.embed(inputs, request.envelope)
        except EncoderError as exc:  # ids out of the vocabulary's bounds
            raise RequestError(str(exc), param="input") from None
        return Embeddings(vectors.numpy(), sum(len(ids) for ids in inputs))

    def engine_record(self, request_id: str):
        return None

    def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        await asyncio.to_thread(self.async_encoder.shutdown)


def build_encoder(model: str, *, device: str, dtype: str, batch_size: int) -> EncoderBackend:
    from engine import Encoder, resolve_encoder_path, served_encoder_name

    encoder = Encoder(resolve_encoder_path(model), device=device, dtype=dtype, batch_size=batch_size)
    return EncoderBackend(encoder, model_name=served_encoder_name(model))


class NullBackend(InProcessTarget):
    """Streams `max_tokens` fixed tokens at once: no model, no tokenizer, no waiting."""

    TOKEN_TEXT = " ok"

    def __init__(self, *, model_name: str = "null", max_model_len: int = 32768) -> None:
        self.model_name = model_name
        self.fingerprint = "null"
        self.max_model_len = max_model_len
        self.expects_records = False
        self.steps: StepHistory | None = None  # no engine, no steps
        self._running = False

    def engine_record(self, request_id: str):
        return None

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool = False) -> list[int]:
        # One token per four bytes, like a typical BPE on English text.
        return list(range(max(1, len(text.encode()) // 4)))

    renders_tools: bool = False

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.encode("".join(f"{m.get('role')}: {m.get('content')}\n" for m in messages), False)

    def token_text(self, token_id: int) -> str:
        return self.TOKEN_TEXT

    async def generate(self, token_ids, params, envelope, request_id) -> AsyncIterator[RequestOutput]:
        for n in range(1, params.max_tokens + 1):
            last = n == params.max_tokens
            for index in range(params.n):
                yield RequestOutput(
                    request_id=request_id, new_token_ids=[7], new_text=self.TOKEN_TEXT,
                    num_prompt_tokens=len(token_ids), num_output_tokens=n,
                    finished=last, finish_reason="length" if last else None, index=index,
                )

    def ready(self) -> bool:
        return self._running

    async def start(self) -> None:
        self._running = True

    async def aclose(self) -> None:
        self._running = False
