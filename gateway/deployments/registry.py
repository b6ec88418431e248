"""The models this gateway serves, each with its tokenizer, context cap and targets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from engine.envelope import ExecutionEnvelope
from engine.outputs import RequestOutput
from gateway.deployments.base import ReplicaLoad
from gateway.deployments.routing import Target


class Tokenizer(Protocol):
    """What the gateway needs of a model's tokenizer: counting, chat rendering, logprob text."""

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool = False) -> list[int]: ...
    def encode_chat(self, messages: list[dict]) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...


@dataclass
class ServedModel:
    name: str
    targets: list[Target]
    # The model's tokenizer, when the gateway has it (the embedded engine's, a tenantgate
    # deployment's, or an upstream's declared one); without it prompts are counted by estimate
    # and run as text on an upstream.
    tokenizer: Tokenizer | None = None
    max_model_len: int | None = None  # the context cap enforced before any target sees the request
    takes_token_ids: bool = True  # false: targets take the caller's text (OpenAI-compatible upstreams)
    logprobs: bool = True  # whether targets return the engine's logprobs
    extras: dict = field(default_factory=dict)


class EmbeddedTarget:
    """The engine in this process (or the null backend): it enforces every decision itself."""

    kind = "embedded"

    def __init__(self, name: str, backend) -> None:
        self.name = name
        self.backend = backend

    @property
    def fingerprint(self) -> str:
        return self.backend.fingerprint

    @property
    def expects_records(self) -> bool:
        return self.backend.expects_records

    def unmet(self, envelope: ExecutionEnvelope, tenant_id: str) -> str | None:
        return None  # the engine's scheduler and block manager honour every isolation, scope and lane

    def run(self, admitted) -> AsyncIterator[RequestOutput]:
        return self.backend.generate(admitted.token_ids, admitted.params, admitted.envelope, admitted.request_id)

    def engine_record(self, request_id: str):
        return self.backend.engine_record(request_id)

    def reported_load(self) -> ReplicaLoad | None:
        return None

    def ready(self) -> bool:
        return self.backend.ready()


def embedded_model(name: str, deployment_name: str, backend) -> ServedModel:
    return ServedModel(name=name, targets=[EmbeddedTarget(deployment_name, backend)], tokenizer=backend,
                       max_model_len=backend.max_model_len)
