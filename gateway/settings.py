"""Gateway settings, read from TENANTGATE_* environment variables (pydantic-settings).

Development defaults run everything on one machine: the embedded engine on the demo
model, the embedded policy, and a local token issuer. Outside development the settings
refuse what would be unsafe in a deployment (the template's `_enforce_non_default_secrets`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.remote import EdgeLimits
from gateway.auth.principal import canonical_guid
from gateway.deployments.config import TokenIds
from gateway.policy.loader import DEFAULT_POLICY_DIR

DEV_NAMESPACE_SECRET = "tenantgate-development-namespace-secret"
# The platform tenant of policies/data/tenants.example.json: development's operator tenant.
DEV_OPERATOR_TENANT = "f0f0f0f0-0000-4000-8000-0000000000f0"
MIN_SECRET_BYTES = 32


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TENANTGATE_", extra="ignore", frozen=True)

    environment: Literal["development", "production"] = "development"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    region: str = "westeurope"

    # -- the engine -----------------------------------------------------------------
    engine: Literal["embedded", "null"] = "embedded"  # null: fixed tokens, no model (benchmarks)
    # A packaged model's name (smollm2-135m-instruct), "demo", a .gguf file or a Hugging Face checkpoint directory.
    model: str = "smollm2-135m-instruct"
    served_model_name: str | None = None  # the name callers use; default: the model's own name
    device: str = "auto"
    dtype: str = "auto"
    # GGUF weights kept quantized and read by the engine's CPU kernels, or dequantized to the dtype
    # (auto: quantized where the kernels build); threads: the engine's CPU threads (0: the CPUs it may use).
    weights: Literal["auto", "quantized", "dequantized"] = "auto"
    threads: int = Field(0, ge=0)
    kv_cache_memory_bytes: int = Field(256 << 20, gt=0)
    # CUDA: the KV pool takes what this share of device memory leaves after weights and activations
    # (0: kv_cache_memory_bytes instead).
    gpu_memory_utilization: float = Field(0.9, ge=0, le=1)
    enforce_eager: bool = False  # CUDA: decode without CUDA graphs
    max_num_seqs: int = Field(64, gt=0)
    # A step's token budget, and its budget while more than one tenant has work: what one tenant's
    # long prompt adds to each step of another tenant's request (docs/engine.md, "Scheduling").
    max_num_batched_tokens: int = Field(2048, gt=0)
    contended_batched_tokens: int = Field(256, gt=0)
    # ... less where the measured cost per token makes such a step longer than this (0: off), and
    # how long after another tenant's last work a step still counts as contended.
    contended_step_ms: float = Field(250.0, ge=0, allow_inf_nan=False)
    contention_window_s: float = Field(5.0, ge=0, allow_inf_nan=False)
    max_model_len: int | None = Field(None, gt=0)
    record_key: SecretStr = SecretStr("")
    # Structured outputs: a JSON schema that takes longer than this to compile is refused (400
    # invalid_json_schema); this many compile at once, one per tenant; compiled schemas kept per
    # cache namespace (docs/api.md, "Structured outputs").
    grammar_compile_timeout_s: float = Field(2.0, gt=0, le=600)
    grammar_workers: int = Field(2, ge=1, le=64)
    grammar_cache_size: int = Field(256, ge=0, le=65536)
    # /v1/embeddings: a packaged encoder's name (all-minilm-l6-v2) or a sentence-transformers
    # checkpoint directory, served beside `model` when there is no deployments file; "" serves none.
    embedding_model: str = "all-minilm-l6-v2"
    # What that encoder reads an integer `input` as, without a deployments file (which declares it
    # per deployment): cl100k_base, the ids OpenAI's clients send (LangChain's OpenAIEmbeddings),
    # decoded and embedded as their text; or native, the encoder's own tokenizer's ids (docs/api.md).
    embedding_token_ids: TokenIds = "cl100k_base"
    # float32 by default: bfloat16 ("auto" on CPUs with bf16) stays within cosine 0.9998 of
    # sentence-transformers, not 0.9999, and the encoder is small (22M parameters).
    embedding_dtype: Literal["auto", "float32", "float16", "bfloat16"] = "float32"
    embedding_batch_size: int = Field(32, ge=1, le=2048)  # a step of the encoder: this many full-length inputs' tokens
    # The most tokens one embeddings request may have across its inputs (OpenAI's 300,000): more is a 400.
    embedding_max_request_tokens: int = Field(300_000, ge=1, le=2048 * 8192)

    # -- deployments (docs/upstreams.md) ----------------------------------------------
    # A JSON file mapping served model names to deployments (embedded, tenantgate engine replicas,
    # OpenAI-compatible upstreams); without it the embedded engine serves `model` alone.
    deployments_file: Path | None = None
    # A JSON file declaring the MCP servers served at /mcp/{name} (docs/mcp.md); without it, none.
    mcp_servers_file: Path | None = None
    # The gateway's base URL as its callers reach it (https://gateway.example.com, behind Front Door):
    # MCP's protected-resource metadata and 401 challenges name it. Empty: each request's own Host,
    # and the metadata is then never cacheable, since a Host header is the caller's to write.
    public_url: str = Field("", pattern=r"^(https?://[^/?#\s]+(/[^?#\s]*)?)?$")
    # The Ed25519 key that signs envelopes for tenantgate engine replicas (they hold its public key).
    envelope_signing_key: Path | None = None
    envelope_ttl_s: int = Field(30, ge=1, le=60)
    route_max_attempts: int = Field(3, ge=1, le=10)  # targets tried before the first output, per request
    breaker_failures: int = Field(3, ge=1, le=100)  # consecutive failures that open a target's breaker
    breaker_open_s: float = Field(10.0, gt=0, le=600)  # how long an open breaker sends requests elsewhere
    route_load_factor: float = Field(1.25, ge=1.0, le=10.0)  # bounded load: a target takes ≤ factor × mean
    load_poll_interval_s: float = Field(1.0, gt=0, le=60)  # how often replicas' queue depth and KV usage are read
    # A stream whose deployment (an engine replica or an upstream) sends nothing for this long after
    # its first output ends with an error; a deployment's own idle_timeout_s overrides it.
    upstream_idle_timeout_s: float = Field(30.0, gt=0, le=3600)

    # -- authentication (Microsoft Entra ID) ----------------------------------------
    authority: str = "https://login.microsoftonline.com"
    v1_issuer_host: str = "https://sts.windows.net"
    audiences: Annotated[list[str], NoDecode] = ["api://tenantgate"]
    token_leeway_s: float = Field(60.0, ge=0, le=600)
    jwks_ttl_s: float = Field(3600.0, gt=0)
    jwks_refetch_window_s: float = Field(300.0, gt=0)
    # A key fetch (discovery and JWKS together) gives up after JWKS_TIMEOUT_S, a connection attempt
    # after JWKS_CONNECT_TIMEOUT_S; after a failure the next try is JWKS_RETRY_S later. A request
    # with a known key never waits for a fetch; these bound the wait of one that has none.
    jwks_timeout_s: float = Field(5.0, gt=0, le=60)
    jwks_connect_timeout_s: float = Field(2.0, gt=0, le=60)
    jwks_retry_s: float = Field(5.0, gt=0, le=300)
    max_token_bytes: int = Field(16384, gt=0)
    # Development only: run a local issuer with real RSA keys (`tenantgate token` mints for it).
    dev_issuer: bool = False
    dev_issuer_port: int = Field(8401, ge=0, le=65535)

    # -- policy ---------------------------------------------------------------------
    policy_backend: Literal["embedded", "opa"] = "embedded"
    policy_dir: Path = DEFAULT_POLICY_DIR
    policy_data_dir: Path | None = None  # default: policy_dir/data
    policy_reload_interval_s: float = Field(2.0, ge=0)  # 0: never reload
    policy_cache_size: int = Field(4096, ge=0)
    opa_url: str = "http://127.0.0.1:8181"
    opa_timeout_s: float = Field(1.0, gt=0)
    opa_refresh_interval_s: float = Field(2.0, gt=0)  # OPA's health and tenant list, asked in the background
    default_data_classification: str = "internal"

    # -- quotas ---------------------------------------------------------------------
    # Empty: budgets live in this process. Else redis://, rediss:// (TLS), with a password in the URL.
    redis_url: SecretStr = SecretStr("")
    redis_entra: bool = False  # authenticate to Azure Managed Redis / Azure Cache with an Entra token
    redis_timeout_s: float = Field(0.25, gt=0, le=10)
    redis_breaker_s: float = Field(1.0, ge=0, le=60)
    # Connections to Redis per pool; a caller waits up to redis_timeout_s for one to come free.
    redis_max_connections: int = Field(256, ge=1, le=65536)
    # A request in flight holds a lease this long, renewed every third of it while it runs: a slot
    # whose release was lost (a replica died, a settle never reached Redis) frees itself after this.
    concurrency_lease_s: float = Field(30.0, ge=1, le=3600)
    # Stored responses (/v1/responses with store: true, where the policy allows it) live in Redis at
    # redis_url; without one nothing is stored. Encrypted with this AES-256-GCM key (base64 of 32
    # bytes); empty: a key derived from namespace_secret.
    responses_store_key: SecretStr = SecretStr("")

    # -- what the gateway adds ------------------------------------------------------
    namespace_secret: SecretStr = SecretStr(DEV_NAMESPACE_SECRET)
    max_body_bytes: int = Field(1 << 20, gt=0)
    # The limits of every listener (the API and the operator port), enforced before any handler or
    # authentication runs (engine/remote/edge.py).
    max_header_bytes: int = Field(32 << 10, ge=1024, le=1 << 20)  # request line and headers: 431 beyond
    header_timeout_s: float = Field(10.0, gt=0, le=300)  # from the first byte of a request to its last header
    body_timeout_s: float = Field(30.0, gt=0, le=600)  # from the last header to the last body byte
    max_connections: int = Field(512, gt=0)  # open client connections; more get 503 and are closed
    # Processes serving the API port (`serve --workers`, docs/operations.md "Workers"). More than one
    # needs what they can share: a deployments file (no embedded engine in each) and Redis (budgets
    # kept in one process each would multiply every tenant's). `worker` is set by the supervisor for
    # each of them: its audit files and operator port are its own.
    workers: int = Field(1, ge=1, le=64)
    worker: int | None = Field(None, ge=0, lt=64)
    # SIGTERM: stop accepting, let requests finish for this long, then abort the rest and exit.
    # Below Kubernetes' default grace period of 30 s, which must also cover the shutdown after it.
    shutdown_timeout_s: float = Field(20.0, gt=0, le=3600)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9100, ge=0, le=65535)  # 0: no metrics listener
    # The audit trail: JSON lines to stdout, a rotating file and/or a Redis Stream (on redis_url).
    audit_stdout: bool = True
    audit_file: Path | None = None
    audit_file_max_bytes: int = Field(100 << 20, gt=0)
    audit_file_backups: int = Field(10, gt=0)
    # What the file sink keeps in memory while its disk refuses writes; past it, records are refused (503).
    audit_file_hold_bytes: int = Field(8 << 20, gt=0)
    audit_redis_stream: str = ""  # e.g. tenantgate:audit
    # Anchors (signed chain heads, kept apart from the trail): to this stream when
    # audit_redis_stream is set, and/or to a file on other storage.
    audit_anchor_stream: str = Field("tenantgate:audit:anchors", min_length=1)
    audit_anchor_file: Path | None = None
    # Ed25519 key that signs the chain's checkpoints; development creates one in the cache.
    audit_signing_key: Path | None = None
    audit_checkpoint_every: int = Field(100, gt=0)
    # Also the anchor interval: how long a record may stay unsigned and a live writer silent.
    audit_checkpoint_interval_s: float = Field(10.0, gt=0, le=300)
    audit_chain_id: str = ""  # the chain id's prefix (default: host name and process id); each boot adds a nonce
    # Prices per model for usage reports and /admin/usage (docs/operations.md, "Usage and chargeback");
    # unset: reports carry no cost column.
    usage_prices_file: Path | None = None
    # The platform's own Entra tenant(s): the only ones whose tokens (with the TenantGate.Operator app
    # role, from a tenant the policy data lists as enabled) reach /admin/* and the console. A customer's
    # admin can grant any app role to their own apps, so the role alone proves nothing. Required
    # outside development; in development, the example data's platform tenant.
    operator_tenants: Annotated[list[str], NoDecode] = []
    # How long an operator console session lasts at most (it also ends with its token).
    console_session_ttl_s: float = Field(900.0, ge=60, le=8 * 3600)

    @model_validator(mode="before")
    @classmethod
    def _csv_lists(cls, values: object) -> object:
        if isinstance(values, dict):
            values = {**values, **{name: _split_csv(values[name]) for name in ("audiences", "operator_tenants")
                                   if name in values}}
        return values

    @model_validator(mode="after")
    def _enforce_safe_production(self) -> Self:
        if not self.audiences:
            raise ValueError("audiences must name at least one accepted token audience")
        if self.max_header_bytes < self.max_token_bytes + 1024:
            raise ValueError("max_header_bytes must leave room for a bearer token of max_token_bytes and 1 KiB more")
        if len(self.namespace_secret.get_secret_value().encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"namespace_secret must be at least {MIN_SECRET_BYTES} bytes")
        if self.responses_store_key.get_secret_value():
            self.responses_key  # noqa: B018 - refuses a key that is not base64 of 32 bytes
        if self.audit_redis_stream and self.audit_anchor_stream == self.audit_redis_stream:
            raise ValueError("audit_anchor_stream must not be the audit stream itself")
        self._enforce_shareable_workers()
        malformed = [tid for tid in self.operator_tenants if canonical_guid(tid) != tid]
        if malformed:
            raise ValueError("operator_tenants must be tenant GUIDs in lower case (8-4-4-4-12)")
        if self.environment == "development":
            return self
        if self.dev_issuer:
            raise ValueError("the development token issuer is refused outside development")
        if self.engine == "null":
            raise ValueError("the null engine is for benchmarks; it is refused outside development")
        if self.namespace_secret.get_secret_value() == DEV_NAMESPACE_SECRET:
            raise ValueError("namespace_secret still has its development value; set TENANTGATE_NAMESPACE_SECRET")
        if self.audit_signing_key is None:
            raise ValueError("audit_signing_key must name the Ed25519 key that signs the audit trail")
        if self.audit_redis_stream and not self.redis_url.get_secret_value():
            raise ValueError("audit_redis_stream needs redis_url")
        if not self.authority.startswith("https://") or not self.v1_issuer_host.startswith("https://"):
            raise ValueError("authority and v1_issuer_host must be https outside development")
        if not self.operator_tenants:
            raise ValueError("operator_tenants must name the platform's own Entra tenant(s): the only tenants "
                             "whose TenantGate.Operator tokens reach /admin and the console")
        return self

    def _enforce_shareable_workers(self) -> None:
        """More than one worker only where nothing that must be shared lives in one process."""
        if self.workers == 1:
            return
        if self.dev_issuer:
            raise ValueError("workers > 1 is refused with the development issuer (serve --dev): run one process")
        if self.deployments_file is None:
            raise ValueError("workers > 1 needs a deployments file (TENANTGATE_DEPLOYMENTS_FILE): each worker "
                             "would load its own embedded engine")
        if not self.redis_url.get_secret_value():
            raise ValueError("workers > 1 needs TENANTGATE_REDIS_URL: budgets kept in each process would "
                             "multiply every tenant's limits by the number of workers")

    @property
    def operator_tenant_ids(self) -> frozenset[str]:
        """The tenants operators come from: the configured ones, else (development only) the example's."""
        if self.operator_tenants or self.environment != "development":
            return frozenset(self.operator_tenants)
        return frozenset({DEV_OPERATOR_TENANT})

    @property
    def edge_limits(self) -> EdgeLimits:
        """The limits every listener of the gateway opens with (the API port and the operator port)."""
        return EdgeLimits(max_header_bytes=self.max_header_bytes, max_body_bytes=self.max_body_bytes,
                          header_timeout_s=self.header_timeout_s, body_timeout_s=self.body_timeout_s,
                          max_connections=self.max_connections)

    @property
    def namespace_key(self) -> bytes:
        return self.namespace_secret.get_secret_value().encode()

    @property
    def responses_key(self) -> bytes:
        """The stored responses' AES-256-GCM key."""
        configured = self.responses_store_key.get_secret_value()
        if not configured:
            return hmac.new(self.namespace_key, b"responses-store", hashlib.sha256).digest()
        try:
            key = base64.b64decode(configured, validate=True)
        except binascii.Error:
            key = b""
        if len(key) != 32:
            raise ValueError("responses_store_key must be the base64 of 32 bytes (an AES-256 key)")
        return key
