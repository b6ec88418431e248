"""What the gateway hands a judged request to: the embedded engine, or a null engine.

The null engine streams fixed tokens with no model; `bench/gateway_overhead.py` puts
the whole gateway in front of it to measure what the gateway itself costs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from engine import ExecutionEnvelope, PendingRecords, RequestOutput, SamplingParams, StepHistory


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


class EngineBackend(GatewayTokenizer):
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
        self.steps = StepHistory()  # the operator console's regime timeline and KV by tenant
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


class EncoderBackend:
    """The embedded sentence encoder (engine/encoder) behind an AsyncEncoder: its worker thread
    runs steps of a few inputs' tokens each, filled fairly across tenants, so the event loop never
    waits on torch and no tenant waits for another's whole batch. Only requests that may share
    (the envelope's isolation and deterministic lane) share a step."""

    expects_records = False

    def __init__(self, encoder, *, model_name: str) -> None:
        from engine import AsyncEncoder

        self.encoder = encoder
        self.async_encoder = AsyncEncoder(encoder)
        self.model_name = model_name
        self.fingerprint = encoder.fingerprint
        self.dimensions = encoder.dimensions

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.encoder.tokenize(texts)

    async def embed(self, inputs: list[list[int]], envelope: ExecutionEnvelope):
        """Unit vectors, one float32 row per input. Raises engine.encoder.EncoderError for ids out of bounds."""
        return await self.async_encoder.embed(inputs, envelope)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.async_encoder.shutdown)


def build_encoder(model: str, *, device: str, dtype: str, batch_size: int) -> EncoderBackend:
    from engine import Encoder, resolve_encoder_path, served_encoder_name

    encoder = Encoder(resolve_encoder_path(model), device=device, dtype=dtype, batch_size=batch_size)
    return EncoderBackend(encoder, model_name=served_encoder_name(model))


class NullBackend:
    """Streams `max_tokens` fixed tokens at once: no model, no tokenizer, no waiting."""

    TOKEN_TEXT = " ok"

    def __init__(self, *, model_name: str = "null", max_model_len: int = 32768) -> None:
        self.model_name = model_name
        self.fingerprint = "null"
        self.max_model_len = max_model_len
        self.expects_records = False
        self.steps = None  # no engine, no steps
        self._running = False

    def engine_record(self, request_id: str):
        return None

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool = False) -> list[int]:
        # One token per four bytes, like a typical BPE on English text.
        return list(range(max(1, len(text.encode()) // 4)))

    renders_tools = False

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
