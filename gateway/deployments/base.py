"""What every deployment client shares: its errors, its load report, what it is asked to run."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine import ExecutionEnvelope, RequestOutput, SamplingParams


class UpstreamUnavailable(Exception):
    """The server could not be reached, timed out, or failed (5xx) before its first output:
    another replica may take the request. The message names the deployment, never content."""


class UpstreamInterrupted(UpstreamUnavailable):
    """The connection ended after the request may have reached the server and before any answer
    came: it may be running there (generating, and charging), so it is sent again to no target.
    Only a failure before the request was written (refused, unreachable, a failed TLS handshake)
    or an answer that says it did not run (a status) lets a request move."""


class UpstreamIdle(UpstreamUnavailable):
    """The server sent nothing for its idle timeout after its first output: the stream ends there."""


class EnvelopeRefused(UpstreamUnavailable):
    """A tenantgate engine replica refused the gateway's signed envelope (403): its keys do not
    include this gateway's (a rotation half done), or the clocks disagree. Nothing ran there, so
    another replica may take the request; the distinct type is for the operator's alert.
    `reason` is the replica's code (engine.remote.REJECTION_REASONS), or "unknown"."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamRejected(Exception):
    """The server refused the request itself (4xx): the caller's to fix, never retried.

    `message` is shown to the caller only (it may quote the caller's own input); it is never logged.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(f"the upstream refused the request with {status}")
        self.status = status
        self.message = message
        self.param = param
        self.code = code  # OpenAI's code when the server gave or implied one (context_length_exceeded)


@dataclass(frozen=True)
class ReplicaLoad:
    """What a replica reports for routing (GET /v1/engine/load on a tenantgate engine server)."""

    queue_depth: int  # requests waiting or running
    kv_usage: float  # share of KV blocks in use, 0..1


@dataclass(frozen=True)
class RunRequest:
    """What a target is asked to run: an admitted request, as every kind of deployment sees it."""

    request_id: str
    route: str  # what it runs as: "chat.completions", "completions" or "embeddings"
    tenant_id: str
    envelope: ExecutionEnvelope  # what the decision allows: the cache namespace, isolation, priority, ...
    params: SamplingParams | None  # clamped by the decision and the context caps; None for embeddings
    token_ids: list[int]  # the prompt's ids, for a deployment that takes ids
    body: dict  # the caller's validated request (wire names): what an upstream is sent
    embed_inputs: list[list[int]] | None = None  # embeddings: each input's ids for the embedded encoder
    embed_texts: list[str] | None = None  # embeddings: cl100k_base ids as their texts, for other upstreams
    headers: dict[str, str] = field(default_factory=dict)  # sent as they are: the attempt's W3C traceparent

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens if self.params is not None else 0


@dataclass(frozen=True)
class UpstreamCall:
    """One request for an OpenAI-compatible upstream, after admission."""

    route: str  # "chat.completions", "completions" or "embeddings"
    body: dict  # the caller's validated request (wire names), without the fields the gateway owns
    max_tokens: int  # already clamped by the decision and the context caps
    envelope: ExecutionEnvelope  # what the decision allows: the cache namespace digest, priority, ...
    request_id: str
    tenant_id: str
    headers: dict[str, str] = field(default_factory=dict)  # sent as they are: the W3C traceparent


@dataclass(frozen=True)
class Embeddings:
    """What a deployment returns for an embeddings request."""

    vectors: np.ndarray  # float32, one row per input, in the caller's order
    prompt_tokens: int  # the deployment's own count of the inputs' tokens (0: it gave none)


@dataclass
class UpstreamOutput(RequestOutput):
    """An OpenAI-compatible upstream's delta."""

    # True on the last delta when its counts are the upstream's `usage`; otherwise the counts are
    # the client's own (output: content deltas seen; prompt: 0) and the caller settles on its own.
    usage_reported: bool = False
    # The upstream's tool calls in this delta, as OpenAI writes them (streamed: pieces with an index;
    # a whole answer: whole calls), held to their strings (tool_call_fields).
    tool_calls: list[dict] = field(default_factory=list)
