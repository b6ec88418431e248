"""The decision document (docs/policy-reference.md, "Decision document") as a strict pydantic model.

Anything missing, unknown or out of range is a policy error, and policy errors deny.
"""

from collections.abc import Callable
from typing import Annotated, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from engine import MAX_PUBLIC_SEGMENTS
from gateway.policy.exceptions import DecisionSchemaError

M = TypeVar("M")  # what a validation returns: a model, or a list of reasons

NonNegativeInt = Annotated[int, Field(ge=0)]
MAX_SEGMENT_TOKENS = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SegmentDecision(_Strict):
    """A public prefix segment (policies/cache): the digest of its exact token ids
    (engine.segment_digest, hex), how many, and the namespace its whole blocks are keyed in."""

    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    tokens: Annotated[int, Field(ge=1, le=MAX_SEGMENT_TOKENS)]
    namespace: Annotated[str, Field(pattern=r"^segment:.+")]


class CacheDecision(_Strict):
    scope: Literal["tenant", "principal", "shared", "none"]
    # "tenant:<tenant_id>", "principal:<tenant_id>:<object_id>", "shared", or "" for none.
    namespace: str
    # Optional, so bundles from before segments still validate.
    segments: Annotated[list[SegmentDecision], Field(max_length=MAX_PUBLIC_SEGMENTS)] = []

    @model_validator(mode="after")
    def _namespace_matches_scope(self) -> Self:
        prefix = {"tenant": "tenant:", "principal": "principal:"}.get(self.scope)
        if self.scope == "none" and self.namespace != "":
            raise ValueError("namespace must be empty when scope is none")
        if self.scope == "shared" and self.namespace != "shared":
            raise ValueError('namespace must be "shared" when scope is shared')
        if prefix and (not self.namespace.startswith(prefix) or self.namespace == prefix):
            raise ValueError(f"namespace must start with {prefix!r} when scope is {self.scope}")
        if self.segments and self.scope not in ("tenant", "principal"):
            raise ValueError("segments need scope tenant or principal (shared shares all, none nothing)")
        return self


class BatchingDecision(_Strict):
    isolation: Literal["shared", "tenant", "exclusive"]
    deterministic: bool
    # Whether the engine may draft tokens from the request's own context and verify them in one
    # step (docs/engine.md, "Speculative decoding"). Optional, so bundles from before it still
    # validate: absent, it does not.
    speculative: bool = False

    @model_validator(mode="after")
    def _deterministic_never_speculates(self) -> Self:
        if self.deterministic and self.speculative:
            raise ValueError("speculative must be false in the deterministic lane")
        return self


class LoggingDecision(_Strict):
    content: Literal["none", "redacted"]
    redact: list[Annotated[str, Field(pattern=r"^/")]]
    retention_days: NonNegativeInt
    # The tenant's name for metric labels, where its policy allows it (policies/logging checks the
    # same pattern); "" or absent: its keyed digest. Optional, so bundles from before it still validate.
    metrics_name: Annotated[str, Field(pattern=r"^([A-Za-z0-9_][A-Za-z0-9_ .-]{0,63})?$")] = ""


class PromptDecision(_Strict):
    # Whether special-token strings in a text-completion prompt are read as special tokens.
    special_tokens: bool


class ResponsesDecision(_Strict):
    # Whether /v1/responses may store a response and continue a stored one, and for how long.
    store: bool
    retention_days: Annotated[int, Field(ge=1, le=365)]


# An Entra authentication context id (the `acrs` claim's values): c1 to c99.
AuthContextId = Annotated[str, Field(pattern=r"^c([1-9]|[1-9][0-9])$")]


class AuthenticationDecision(_Strict):
    """What the token must show for this request (policies/authn), and what the gateway may answer
    when it does not: the contexts needed and those missing, the oldest sign-in accepted (seconds
    since auth_time, 0: any; the gateway compares it with the clock), whether the tenant's data
    revokes the token, and whether the client takes a claims challenge (it declared cp1)."""

    contexts: list[AuthContextId] = []
    missing: list[AuthContextId] = []
    max_age_s: NonNegativeInt = 0
    revoked: bool = False
    challenge: bool = False

    @model_validator(mode="after")
    def _missing_is_needed(self) -> Self:
        if not set(self.missing) <= set(self.contexts):
            raise ValueError("missing names a context that contexts does not")
        return self


class LimitsDecision(_Strict):
    max_tokens: NonNegativeInt
    max_context_tokens: NonNegativeInt
    tokens_per_minute: NonNegativeInt
    requests_per_minute: NonNegativeInt
    kv_blocks: NonNegativeInt
    priority: NonNegativeInt
    principal_requests_per_minute: NonNegativeInt
    principal_tokens_per_minute: NonNegativeInt
    concurrent_requests: NonNegativeInt
    max_choices: NonNegativeInt  # the largest n a request may ask for
    fail_open: bool  # served, unaccounted, when the quota store is unreachable
    # Structured outputs: the largest schema (bytes of compact JSON) and deepest nesting a request may ask for.
    max_schema_bytes: NonNegativeInt
    max_schema_depth: NonNegativeInt


class Decision(_Strict):
    allow: bool
    reasons: list[str]
    cache: CacheDecision
    batching: BatchingDecision
    logging: LoggingDecision
    prompt: PromptDecision
    responses: ResponsesDecision
    limits: LimitsDecision
    # Optional, so bundles from before it still validate (they require nothing of the token).
    authentication: AuthenticationDecision = AuthenticationDecision()

    @model_validator(mode="after")
    def _deny_carries_a_reason(self) -> Self:
        if not self.allow and not self.reasons:
            raise ValueError("a denied decision must carry at least one reason")
        if self.allow and (self.authentication.revoked or self.authentication.missing):
            raise ValueError("an allowed decision cannot revoke the token or miss an authentication context")
        if self.allow and self.limits.max_tokens < 1:
            raise ValueError("an allowed decision must leave max_tokens of at least 1")
        return self


class ToolBudget(_Strict):
    calls_per_minute: NonNegativeInt  # per tool (per server for a listing), for the tenant and each principal
    concurrency: NonNegativeInt  # the tenant's calls of this tool in flight at once
    max_result_bytes: NonNegativeInt  # the largest result the caller may get (the server's own cap applies too)
    cache: bool  # whether a result may be cached (and so reused for the same arguments)


class ToolsLogging(_Strict):
    content: Literal["none", "redacted"]  # whether a call's arguments and result may reach its record, redacted
    redact: list[Annotated[str, Field(pattern=r"^/")]]  # pointers into {"arguments", "result"}


class ToolsDecision(_Strict):
    """data.tenantgate.tools.decision: one per MCP tools/list and tools/call (docs/policy-reference.md, "Tools")."""

    allow: bool
    reasons: list[str]
    listed: list[str]  # the tools a listing shows; a denied tool is never listed
    tool: ToolBudget
    logging: ToolsLogging

    @model_validator(mode="after")
    def _deny_carries_a_reason(self) -> Self:
        if not self.allow and not self.reasons:
            raise ValueError("a denied decision must carry at least one reason")
        if not self.allow and self.listed:
            raise ValueError("a denied decision lists no tools")
        return self


def _problems(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors(include_url=False, include_input=False):
        field = ".".join(str(part) for part in item["loc"]) or "<decision>"
        problems.append(f"{field}: {item['msg']}")
    return problems


def _checked(validate: Callable[[], M]) -> M:
    """validate()'s model, or DecisionSchemaError naming each bad field."""
    try:
        return validate()
    except ValidationError as exc:
        raise DecisionSchemaError(_problems(exc)) from None


def parse_decision(document: str | bytes) -> Decision:
    """Validates a decision given as JSON; raises DecisionSchemaError naming each bad field."""
    return _checked(lambda: Decision.model_validate_json(document))


def validate_decision(document: object) -> Decision:
    """Validates a decision given as a Python value (as parsed from JSON)."""
    return _checked(lambda: Decision.model_validate(document, strict=True))


def parse_tools_decision(document: str | bytes) -> ToolsDecision:
    """Validates a tools decision given as JSON; raises DecisionSchemaError naming each bad field."""
    return _checked(lambda: ToolsDecision.model_validate_json(document))


def validate_tools_decision(document: object) -> ToolsDecision:
    return _checked(lambda: ToolsDecision.model_validate(document, strict=True))


_DENIALS = TypeAdapter(list[str])


def parse_argument_denials(document: str | bytes) -> list[str]:
    """data.tenantgate.tools.arguments.denials given as JSON: reasons (a set in Rego, so an array)."""
    if document == "[]":  # none, as nearly every call has: what validation would make of it
        return []
    return _checked(lambda: _DENIALS.validate_json(document))


def validate_argument_denials(document: object) -> list[str]:
    return _checked(lambda: _DENIALS.validate_python(document, strict=True))


def with_argument_denials(decision: ToolsDecision, denials: list[str]) -> ToolsDecision:
    """A tools/call the decision allows is still refused when its arguments are: then it is a denial
    like any other (no budget, nothing logged), with the arguments' reasons (docs/policy-reference.md,
    "Tools decision")."""
    if not decision.allow or not denials:
        return decision
    return ToolsDecision(allow=False, reasons=sorted(denials), listed=[],
                         tool=ToolBudget(calls_per_minute=0, concurrency=0, max_result_bytes=0, cache=False),
                         logging=ToolsLogging(content="none", redact=["/arguments", "/result"]))
