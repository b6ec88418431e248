"""The models this gateway serves, each with its tokenizer, context cap and targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.deployments.config import Deployment, DeploymentsError, TokenIds
from gateway.deployments.openai_compatible import OpenAIUpstream
from gateway.deployments.replica_client import ReplicaClient
from gateway.deployments.routing import Target
from gateway.deployments.targets import ReplicaTarget, UpstreamTarget


class Tokenizer(Protocol):
    """What the gateway needs of a model's tokenizer: counting, chat rendering, logprob text."""

    def encode(self, text: str, add_special_tokens: bool, parse_special: bool = False) -> list[int]: ...
    @property
    def renders_tools(self) -> bool: ...  # whether the chat template has a tools section

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...


@dataclass
class ServedModel:
    name: str
    targets: list[Target]
    # The model's tokenizer, when the gateway has it (the embedded engine's, a tenantgate
    # deployment's, or an upstream's declared one); without it prompts are counted by estimate
    # and run as text on an upstream.
    tokenizer: Tokenizer | None = None
    context_tokens: int | None = None  # the smallest context window the deployments file declares
    # False: targets take the caller's text and return no logprobs (OpenAI-compatible upstreams).
    takes_token_ids: bool = True
    task: Literal["generate", "embed"] = "generate"  # embed: /v1/embeddings only
    # embed: each text's ids as the encoder runs them (truncated at its length), when the gateway
    # has the encoder; without it inputs are counted by estimate and sent as text.
    tokenize_inputs: Callable[[list[str]], list[list[int]]] | None = None
    # embed: what integer inputs are; cl100k_base ones are decoded and embedded as their text.
    token_ids: TokenIds = "native"

    @property
    def max_model_len(self) -> int | None:
        """The context cap enforced before any target sees a request: the declared one, and each
        target's own once it is known (a replica's, from its first answer to /v1/engine/info)."""
        caps = [cap for cap in (self.context_tokens, *(t.max_model_len for t in self.targets)) if cap is not None]
        return min(caps) if caps else None


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of a model reference (a packaged name, demo, a .gguf file or a checkpoint
    directory), as the engine would load it; GGUF files are converted once and cached."""
    from engine import Tokenizer as EngineTokenizer
    from engine import resolve_model_path
    from gateway.inference import GatewayTokenizer

    return GatewayTokenizer(EngineTokenizer.from_dir(resolve_model_path(model, progress=False)))


def _served_encoder(model: str, deployments: list[Deployment], encoder) -> ServedModel:
    """An embedding model: the embedded encoder, or OpenAI-compatible upstreams (not both: the
    gateway's token count and an upstream's could differ for the same inputs)."""
    kinds = {d.kind for d in deployments}
    if len(kinds) > 1:
        raise DeploymentsError(f"model {model}: an embedded encoder cannot be mixed with upstreams")
    meanings = {d.token_ids for d in deployments}
    if len(meanings) > 1:  # a request could fail over to a deployment that reads its ids otherwise
        raise DeploymentsError(f"model {model}: its deployments must all read token ids alike "
                               f"(token_ids {' and '.join(sorted(meanings))})")
    token_ids = meanings.pop()
    if kinds == {"embedded"}:
        if encoder is None:
            raise DeploymentsError(f"deployment {deployments[0].name}: no embedded encoder was built "
                                   "(set TENANTGATE_EMBEDDING_MODEL)")
        encoder.name = deployments[0].name  # the encoder is its deployment's target
        return ServedModel(name=model, targets=[encoder], task="embed",
                           tokenize_inputs=encoder.tokenize, token_ids=token_ids)
    return ServedModel(name=model, targets=[UpstreamTarget(d, OpenAIUpstream(d, model)) for d in deployments],
                       takes_token_ids=False, task="embed", token_ids=token_ids)


def served_model_for(model: str, deployments: list[Deployment], engine, signer, encoder=None) -> ServedModel:
    """A served model from its deployments file entries. All of a model's deployments run the same
    model, so one tokenizer counts for all; a model that mixes upstreams (text) with engines (ids)
    is refused, since its requests could not fail over from one to the other."""
    tasks = {d.task for d in deployments}
    if len(tasks) > 1:
        raise DeploymentsError(f"model {model}: its deployments must all have the same task")
    if tasks == {"embed"}:
        return _served_encoder(model, deployments, encoder)
    kinds = {d.kind for d in deployments}
    if "openai" in kinds and len(kinds) > 1:
        raise DeploymentsError(f"model {model}: OpenAI-compatible upstreams cannot be mixed with engine deployments")
    targets, tokenizer, declared = [], None, []
    for d in deployments:
        if d.kind == "embedded":
            if engine is None:
                raise DeploymentsError(f"deployment {d.name}: no embedded engine was built")
            engine.name = d.name  # the engine is its deployment's target (one embedded deployment per task)
            targets.append(engine)
            tokenizer = tokenizer or engine
        elif d.kind == "tenantgate":
            for index, url in enumerate(d.replicas):
                replica = ReplicaClient(url, signer, connect_timeout_s=d.connect_timeout_s, timeout_s=d.timeout_s,
                                            first_token_timeout_s=d.first_token_timeout_s,
                                            idle_timeout_s=d.idle_timeout_s, name=f"{d.name}/{index}")
                targets.append(ReplicaTarget(f"{d.name}/{index}", replica))
            tokenizer = tokenizer or load_tokenizer(d.tokenizer or model)
        else:
            targets.append(UpstreamTarget(d, OpenAIUpstream(d, model)))
            if d.tokenizer is not None:
                tokenizer = tokenizer or load_tokenizer(d.tokenizer)
        if d.context_tokens is not None:
            declared.append(d.context_tokens)
    return ServedModel(name=model, targets=targets, tokenizer=tokenizer, context_tokens=min(declared, default=None),
                       takes_token_ids=kinds != {"openai"})
