"""Deployments: which servers run each model the gateway serves.

`TENANTGATE_DEPLOYMENTS_FILE` names a JSON file:

    {"models": {
        "smollm2-135m-instruct": [{"name": "local", "kind": "embedded"}],
        "llama-3.1-8b-instruct": [
            {"name": "vllm-a", "kind": "openai", "dialect": "vllm", "url": "http://vllm:8000/v1",
             "upstream_model": "meta-llama/Llama-3.1-8B-Instruct", "batch_invariant": true,
             "api_key_file": "/mnt/secrets/vllm-api-key"}],
        "qwen2.5-7b-instruct": [
            {"name": "engines", "kind": "tenantgate", "replicas": ["http://engine-0:8100", "http://engine-1:8100"]}],
        "all-minilm-l6-v2": [{"name": "local-encoder", "kind": "embedded", "task": "embed"}],
        "bge-m3": [{"name": "vllm-embed", "kind": "openai", "dialect": "vllm", "url": "http://vllm-embed:8000/v1",
                    "task": "embed", "upstream_model": "BAAI/bge-m3"}]
    }}

`task` says what a model does: "generate" (chat and completions, the default) or "embed"
(/v1/embeddings). An embedded embed deployment is the gateway's own encoder (the
`embedding_model` setting); tenantgate engine replicas only generate. `token_ids` says what
an embedding model's integer inputs are (cl100k_base unless declared native).

Without the file the gateway serves one embedded deployment of the `model` setting, as it
always has. A model listed here is still only usable by tenants whose policy names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Dialect = Literal["vllm", "sglang", "llamacpp", "azure-openai", "openai"]
TokenIds = Literal["native", "cl100k_base"]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]


class DeploymentsError(ValueError):
    """The deployments file is missing, unreadable or invalid; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Credentials(_Strict):
    """How the gateway authenticates to an upstream. At most one source; none sends no credential."""

    api_key_env: str | None = None  # the name of an environment variable holding the key
    api_key_file: Path | None = None  # a mounted secret (read at start and again when it changes)
    # Azure OpenAI: an Entra token from azure-identity (managed or workload identity) for this scope.
    entra_scope: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if sum(x is not None for x in (self.api_key_env, self.api_key_file, self.entra_scope)) > 1:
            raise ValueError("give at most one of api_key_env, api_key_file and entra_scope")
        return self


class Deployment(Credentials):
    name: Name  # unique across the file; in audit records and metrics
    kind: Literal["embedded", "tenantgate", "openai"]
    task: Literal["generate", "embed"] = "generate"
    dialect: Dialect | None = None  # kind openai only
    url: str | None = None  # kind openai: the base URL up to /v1 (Azure: the resource endpoint)
    replicas: list[str] = []  # kind tenantgate: the engine servers' base URLs
    upstream_model: str | None = None  # the name the upstream knows the model by; default: the served name
    azure_deployment: str | None = None  # azure-openai: the deployment name in the URL path
    azure_api_version: str = "2024-10-21"  # azure-openai: the api-version query parameter
    # What the server guarantees, declared by whoever deployed it; routing trusts these.
    batch_invariant: bool = False  # outputs do not depend on batch composition (vLLM's VLLM_BATCH_INVARIANT=1)
    dedicated_tenants: list[str] = []  # Entra tenant ids whose requests alone this server runs
    # How the server orders its queue by a request's priority: vLLM `--scheduling-policy priority`
    # is lower-first; SGLang `--enable-priority-scheduling` is higher-first, lower-first with
    # `--schedule-low-priority-values-first`. "off" sends no priority (vLLM refuses one then).
    priority_scheduling: Literal["off", "lower-first", "higher-first"] = "off"
    # llamacpp: let the server reuse prompt KV (`cache_prompt: true`). It has one cache for all its
    # requests, so it then only takes requests that may all share (docs/upstreams.md).
    cache_prompt: bool = False
    # The gateway's own tokenizer for counting an upstream's prompts (a model reference, as for
    # the embedded engine); without one, upstream prompts are counted by estimate.
    tokenizer: str | None = None
    context_tokens: int | None = Field(None, gt=0)  # the upstream's context window, enforced before sending
    timeout_s: float = Field(300.0, gt=0, le=3600)  # a whole request
    connect_timeout_s: float = Field(2.0, gt=0, le=60)
    first_token_timeout_s: float = Field(60.0, gt=0, le=3600)  # before it, a request may fail over
    # The longest silence between two outputs once the first has come; unset: the gateway's
    # upstream_idle_timeout_s (TENANTGATE_UPSTREAM_IDLE_TIMEOUT_S).
    idle_timeout_s: float = Field(30.0, gt=0, le=3600)
    # Task embed: what an integer `input` means (docs/api.md, "Embeddings"). cl100k_base: ids of
    # OpenAI's tokenizer, which OpenAI's clients send (LangChain's OpenAIEmbeddings), embedded as
    # the text they encode; native: ids of the model's own tokenizer, run (or sent) as given.
    token_ids: TokenIds = "cl100k_base"

    @model_validator(mode="after")
    def _fields_for_kind(self) -> Self:
        if self.kind == "openai":
            if self.dialect is None or not self.url:
                raise ValueError("kind openai needs a dialect and a url")
            if self.dialect == "azure-openai" and not self.azure_deployment:
                raise ValueError("dialect azure-openai needs azure_deployment")
            allowed = {"vllm": {"off", "lower-first"}, "sglang": {"off", "lower-first", "higher-first"}}
            if self.priority_scheduling not in allowed.get(self.dialect, {"off"}):
                raise ValueError(f"priority_scheduling {self.priority_scheduling} is not possible "
                                 f"for dialect {self.dialect}")
            if self.cache_prompt and self.dialect != "llamacpp":
                raise ValueError("cache_prompt is for dialect llamacpp")
        elif self.dialect is not None or self.url is not None:
            raise ValueError(f"dialect and url are for kind openai, not {self.kind}")
        if self.task == "embed" and self.kind == "tenantgate":
            raise ValueError("tenantgate engine replicas do not embed: use kind embedded or openai for task embed")
        if self.task == "embed" and (self.tokenizer is not None or self.cache_prompt):
            raise ValueError("tokenizer and cache_prompt are for task generate")
        if self.task == "generate" and "token_ids" in self.model_fields_set:
            raise ValueError("token_ids is for task embed")
        if self.kind == "tenantgate" and not self.replicas:
            raise ValueError("kind tenantgate needs at least one replica URL")
        if self.kind != "tenantgate" and self.replicas:
            raise ValueError("replicas are for kind tenantgate")
        for url in [self.url, *self.replicas]:
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return self


class DeploymentsFile(_Strict):
    models: dict[Name, Annotated[list[Deployment], Field(min_length=1)]]

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        names = [d.name for deployments in self.models.values() for d in deployments]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"deployment names must be unique; repeated: {', '.join(duplicated)}")
        for task in ("generate", "embed"):
            embedded = [d.name for d in self.models_of_kind("embedded") if d.task == task]
            if len(embedded) > 1:
                raise ValueError(f"at most one embedded {task} deployment per gateway; found {', '.join(embedded)}")
        return self

    def models_of_kind(self, kind: str) -> list[Deployment]:
        return [d for deployments in self.models.values() for d in deployments if d.kind == kind]


def validation_problems(error: ValidationError) -> str:
    """A configuration file's problems, each as its field's path and pydantic's rule (never the value)."""
    return "; ".join(f"{'.'.join(str(p) for p in item['loc']) or '<file>'}: {item['msg']}"
                     for item in error.errors(include_url=False, include_input=False))


def read_json_file(path: Path, what: str, error: type[Exception]) -> bytes:
    """The bytes of the JSON file `path` (`what` names it in errors), or `error` saying why not."""
    try:
        document = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror}") from None
    try:
        json.loads(document)
    except ValueError as exc:
        raise error(f"the {what} {path} is not JSON: {exc}") from None
    return document


def parse_deployments(document: str | bytes) -> DeploymentsFile:
    try:
        return DeploymentsFile.model_validate_json(document)
    except ValidationError as exc:
        raise DeploymentsError(f"invalid deployments: {validation_problems(exc)}") from None


def load_deployments(path: Path) -> DeploymentsFile:
    return parse_deployments(read_json_file(path, "deployments file", DeploymentsError))


def embedded_only(model_name: str | None, encoder_name: str | None = None,
                  token_ids: TokenIds = "cl100k_base") -> DeploymentsFile:
    """What a gateway without a deployments file serves: its embedded engine under one name, and
    its embedded encoder (when it has one) under another, reading integer inputs as `token_ids`."""
    models = {}
    if model_name is not None:
        models[model_name] = [Deployment(name="embedded", kind="embedded")]
    if encoder_name is not None:
        models[encoder_name] = [Deployment(name="embedded-encoder", kind="embedded", task="embed",
                                           token_ids=token_ids)]
    return DeploymentsFile(models=models)


def deployments_for(settings) -> DeploymentsFile | None:
    """The settings' deployments file, checked against the settings it needs; None without one."""
    if settings.deployments_file is None:
        return None
    deployments = load_deployments(settings.deployments_file)
    if deployments.models_of_kind("tenantgate") and settings.envelope_signing_key is None:
        raise DeploymentsError("tenantgate deployments need envelope_signing_key (TENANTGATE_ENVELOPE_SIGNING_KEY)")
    return with_idle_timeout(deployments, settings.upstream_idle_timeout_s)


def with_idle_timeout(deployments: DeploymentsFile, idle_timeout_s: float) -> DeploymentsFile:
    """The file with the gateway's idle timeout on each deployment that sets none of its own."""
    def defaulted(d: Deployment) -> Deployment:
        return d if "idle_timeout_s" in d.model_fields_set else d.model_copy(update={"idle_timeout_s": idle_timeout_s})

    return deployments.model_copy(update={"models": {model: [defaulted(d) for d in ds]
                                                      for model, ds in deployments.models.items()}})
