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


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of a model reference (a packaged name, demo, a .gguf file or a checkpoint
    directory), as the engine would load it; GGUF files are converted once and cached."""
    from engine.model.catalog import resolve_model_path
    from engine.tokenizer import Tokenizer as EngineTokenizer
    from gateway.inference import GatewayTokenizer

    return GatewayTokenizer(EngineTokenizer.from_dir(resolve_model_path(model, progress=False)))


def served_model_for(model: str, deployments: list, engine, signer) -> ServedModel:
    """A served model from its deployments file entries. All of a model's deployments run the same
    model, so one tokenizer counts for all; a model that mixes upstreams (text) with engines (ids)
    is refused, since its requests could not fail over from one to the other."""
    from gateway.deployments.config import DeploymentsError
    from gateway.deployments.openai import OpenAIUpstream
    from gateway.deployments.targets import ReplicaTarget, UpstreamTarget
    from gateway.deployments.tenantgate import TenantgateReplica

    kinds = {d.kind for d in deployments}
    if "openai" in kinds and len(kinds) > 1:
        raise DeploymentsError(f"model {model}: OpenAI-compatible upstreams cannot be mixed with engine deployments")
    targets, tokenizer, lengths = [], None, []
    for d in deployments:
        if d.kind == "embedded":
            if engine is None:
                raise DeploymentsError(f"deployment {d.name}: no embedded engine was built")
            targets.append(EmbeddedTarget(d.name, engine))
            tokenizer = tokenizer or engine
            lengths.append(engine.max_model_len)
        elif d.kind == "tenantgate":
            for index, url in enumerate(d.replicas):
                replica = TenantgateReplica(url, signer, connect_timeout_s=d.connect_timeout_s, timeout_s=d.timeout_s,
                                            first_token_timeout_s=d.first_token_timeout_s, name=f"{d.name}/{index}")
                targets.append(ReplicaTarget(f"{d.name}/{index}", replica))
            tokenizer = tokenizer or load_tokenizer(d.tokenizer or model)
        else:
            targets.append(UpstreamTarget(d, OpenAIUpstream(d, model)))
            if d.tokenizer is not None:
                tokenizer = tokenizer or load_tokenizer(d.tokenizer)
        if d.context_tokens is not None:
            lengths.append(d.context_tokens)
    upstream = kinds == {"openai"}
    return ServedModel(name=model, targets=targets, tokenizer=tokenizer, max_model_len=min(lengths) if lengths else None,
                       takes_token_ids=not upstream, logprobs=not upstream)
