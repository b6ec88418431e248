"""The app factory: builds the gateway from a Settings object; nothing is built at import time.

Tests and benchmarks pass their own backend, policy or verifier; anything not passed is
built from the settings when the app starts, and closed when it stops.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import cast

from fastapi import FastAPI
from fastapi.responses import Response

from engine.paths import default_cache_dir
from engine.remote import NO_NATIVE_TELEMETRY
from gateway.audit import (
    AuditRecorder,
    AuditSink,
    AuditTrail,
    RedisStreamSink,
    RotatingFileSink,
    StreamSink,
    boot_chain_id,
    load_or_create_signing_key,
    worker_file,
)
from gateway.context import DevIssuer, Gateway
from gateway.deployments.config import deployments_for, embedded_only
from gateway.deployments.registry import ServedModel, served_model_for
from gateway.deployments.routing import Router
from gateway.deployments.targets import LoadPoller, ReplicaTarget
from gateway.error_handlers import install_handlers
from gateway.inference import EncoderBackend, EngineBackend, InferenceBackend, NullBackend, build_encoder
from gateway.limits import InProcessLimiter, Limiter
from gateway.mcp import build_mcp
from gateway.mcp import router as mcp_router
from gateway.metrics import GatewayMetrics
from gateway.middleware import (
    BodySizeLimit,
    RequestMetrics,
    RequestsBeforeShutdown,
    RequestTracing,
    ResponseHeaders,
    UnexpectedErrors,
)
from gateway.pipeline.run import ClientGone
from gateway.plain_routes import PlainRoutes
from gateway.policy.service import EmbeddedPolicy, OpaPolicy, PolicyEngine
from gateway.settings import Settings
from gateway.tracing import TRACER_NAME, tracer_provider

logger = logging.getLogger("tenantgate.gateway")


def build_policy(settings: Settings) -> PolicyEngine:
    if settings.policy_backend == "opa":
        return OpaPolicy(settings.opa_url, timeout_s=settings.opa_timeout_s,
                         refresh_interval_s=settings.opa_refresh_interval_s)
    return EmbeddedPolicy(settings.policy_dir, settings.policy_data_dir, cache_size=settings.policy_cache_size,
                          reload_interval_s=settings.policy_reload_interval_s)


async def build_backend(settings: Settings, metrics: GatewayMetrics, name: str | None = None) -> InferenceBackend:
    if settings.engine == "null":
        return NullBackend(model_name=name or settings.served_model_name or "null")
    from engine import EngineConfig, LLMEngine, PrometheusSink, served_model_name

    config = EngineConfig(
        model=settings.model, device=settings.device, dtype=settings.dtype, weights=settings.weights,
        threads=settings.threads or None,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes, max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        contended_batched_tokens=settings.contended_batched_tokens,
        contended_step_ms=settings.contended_step_ms, contention_window_s=settings.contention_window_s,
        gpu_memory_utilization=settings.gpu_memory_utilization or None, enforce_eager=settings.enforce_eager,
        max_model_len=settings.max_model_len, record_key=settings.record_key.get_secret_value().encode(),
        grammar_compile_timeout_s=settings.grammar_compile_timeout_s, grammar_workers=settings.grammar_workers,
        grammar_cache_size=settings.grammar_cache_size,
    )
    sink = PrometheusSink(metrics.registry)
    engine = await asyncio.to_thread(LLMEngine, config, False, [sink])
    sink.watch(engine)
    name = name or settings.served_model_name or served_model_name(settings.model)
    return EngineBackend(engine, model_name=name)


async def build_encoder_backend(settings: Settings) -> EncoderBackend | None:
    from engine import ModelNotFoundError

    if not settings.embedding_model or settings.engine == "null":
        return None
    try:
        return await asyncio.to_thread(build_encoder, settings.embedding_model, device=settings.device,
                                       dtype=settings.embedding_dtype, batch_size=settings.embedding_batch_size)
    except ModelNotFoundError as exc:
        if "embedding_model" in settings.model_fields_set:
            raise  # asked for by name: not serving it is an error
        # The default's wheel is not installed: the gateway serves no embeddings, as before them.
        logger.warning("no embeddings: %s", exc)
        return None


async def build_models(settings: Settings, metrics: GatewayMetrics, stack: AsyncExitStack,
                       backend: InferenceBackend | None, encoder: EncoderBackend | None = None,
                       ) -> tuple[dict[str, ServedModel], InferenceBackend | None]:
    """The served models from the deployments file, or the embedded engine (and encoder) alone
    without one. A backend or encoder passed in is the embedded deployment's (tests and
    benchmarks); a test that passes a backend and no encoder serves no embeddings."""
    deployments = deployments_for(settings)
    embedded = [(model, d) for model, ds in (deployments.models.items() if deployments else ()) for d in ds
                if d.kind == "embedded" and d.task == "generate"]
    encoded = [d for d in deployments.models_of_kind("embedded") if d.task == "embed"] if deployments else []
    engine = backend
    if engine is None and (deployments is None or embedded):
        engine = await build_backend(settings, metrics, name=embedded[0][0] if embedded else None)
        stack.push_async_callback(engine.aclose)
    if encoder is None and (encoded or (deployments is None and backend is None)):
        encoder = await build_encoder_backend(settings)
        if encoder is not None:
            stack.push_async_callback(encoder.aclose)
    if deployments is None:
        deployments = embedded_only(engine.model_name if engine is not None else None,
                                    encoder.model_name if encoder is not None else None,
                                    settings.embedding_token_ids)
    signer = None
    if deployments.models_of_kind("tenantgate"):
        from engine.remote import EnvelopeSigner, load_private_key

        key_file = cast(Path, settings.envelope_signing_key)  # set: deployments_for checks it
        signer = EnvelopeSigner(load_private_key(key_file), ttl_s=settings.envelope_ttl_s)
    models: dict[str, ServedModel] = {}
    replicas: list[ReplicaTarget] = []
    for model, entries in deployments.models.items():
        served = await asyncio.to_thread(served_model_for, model, entries, engine, signer, encoder)
        for target in served.targets:
            if target.remote:  # an engine in this process is closed above, where the app built it
                stack.push_async_callback(target.aclose)
            if isinstance(target, ReplicaTarget):
                replicas.append(target)
        models[model] = served
    poller = LoadPoller(replicas, settings.load_poll_interval_s)
    await poller.start()
    stack.push_async_callback(poller.aclose)
    return models, engine


def build_limiter(settings: Settings) -> Limiter:
    url = settings.redis_url.get_secret_value()
    if not url:
        return InProcessLimiter()
    from gateway.limits.redis import RedisLimiter, redis_client

    client = redis_client(url, timeout_s=settings.redis_timeout_s, entra=settings.redis_entra,
                          max_connections=settings.redis_max_connections)
    return RedisLimiter(client, breaker_s=settings.redis_breaker_s, lease_s=settings.concurrency_lease_s)


def build_responses_store(settings: Settings):
    """Stored responses live in Redis beside the budgets; without Redis nothing is stored."""
    url = settings.redis_url.get_secret_value()
    if not url:
        return None
    from gateway.limits.redis import redis_client
    from gateway.openai.responses_api.store import ResponseStore

    return ResponseStore(redis_client(url, timeout_s=settings.redis_timeout_s, entra=settings.redis_entra),
                         settings.responses_key)


def build_audit(settings: Settings, metrics: GatewayMetrics) -> AuditRecorder:
    from gateway.redaction import Redactor

    sinks: list[AuditSink] = []
    anchors: list[AuditSink] = []
    redis_sink: RedisStreamSink | None = None
    if settings.audit_stdout:
        sinks.append(StreamSink())
    if settings.audit_file is not None:
        sinks.append(RotatingFileSink(_own_file(settings, settings.audit_file), settings.audit_file_max_bytes,
                                      settings.audit_file_backups, settings.audit_file_hold_bytes))
    if settings.audit_redis_stream:
        import redis

        client = redis.Redis.from_url(settings.redis_url.get_secret_value(), socket_timeout=settings.redis_timeout_s,
                                      socket_connect_timeout=settings.redis_timeout_s)
        redis_sink = RedisStreamSink(client, settings.audit_redis_stream)
        sinks.append(redis_sink)
        anchors.append(RedisStreamSink(client, settings.audit_anchor_stream))
    if settings.audit_anchor_file is not None:
        anchors.append(RotatingFileSink(_own_file(settings, settings.audit_anchor_file), settings.audit_file_max_bytes,
                                        settings.audit_file_backups, settings.audit_file_hold_bytes))
    key_path = settings.audit_signing_key or default_cache_dir() / "audit-signing.pem"
    key_path.parent.mkdir(parents=True, exist_ok=True)
    trail = AuditTrail(sinks, load_or_create_signing_key(key_path),
                       checkpoint_every=settings.audit_checkpoint_every,
                       checkpoint_interval_s=settings.audit_checkpoint_interval_s,
                       chain_id=boot_chain_id(settings.audit_chain_id), anchors=anchors)
    metrics.watch_audit(trail, redis_sink)
    key = settings.namespace_key
    return AuditRecorder(trail, key, Redactor(key + b":redaction"))


def _own_file(settings: Settings, path: Path) -> Path:
    """This process's audit file: `path` itself, or under `serve --workers` its worker's own."""
    return path if settings.worker is None else worker_file(path, settings.worker)


class _GatewayApp(FastAPI):
    def build_middleware_stack(self):
        # Outside Starlette's error layer, so its 500s carry the response headers too.
        return UnexpectedErrors(ResponseHeaders(super().build_middleware_stack()))


def freeze_startup_heap() -> None:
    """Moves what start-up built (modules, the policy, the model's objects: about 118,000 objects
    with the null engine) out of the cyclic garbage collector's reach.

    Each full collection walked all of it on the event loop, between two requests of whichever
    tenants: in 6,000 requests the gateway paused 5 times, 406 ms in all and 115 ms at worst. With
    the start-up heap frozen, 4 pauses took 31 ms, 11 ms at worst (issue 31). A frozen object is
    still freed when its last reference goes; only a cycle among start-up objects that later
    becomes garbage is never collected, a bounded amount, once."""
    gc.collect()
    gc.freeze()


SETTLE_AT_SHUTDOWN_S = 5.0


async def _settle_pending(gateway: Gateway) -> None:
    """The budget settlements still running when the server stops finish first (each is a task of
    its own, so a request that ended just now is still charged), at most SETTLE_AT_SHUTDOWN_S."""
    if gateway.background:
        await asyncio.wait(set(gateway.background), timeout=SETTLE_AT_SHUTDOWN_S)


async def build_gateway(settings: Settings, stack: AsyncExitStack, *, metrics: GatewayMetrics,
                        backend: InferenceBackend | None = None, policy: PolicyEngine | None = None, verifier=None,
                        limiter: Limiter | None = None, encoder: EncoderBackend | None = None,
                        issuer: DevIssuer | None = None) -> Gateway:
    """Builds and starts every part of a gateway from its settings; `stack` closes each part it
    built, in reverse order. A part passed in is the caller's: started here, closed by its owner."""
    app_policy = policy or build_policy(settings)
    if policy is None:
        stack.push_async_callback(app_policy.aclose)
    await app_policy.start()
    metrics.watch_policy(app_policy)

    authority, v1_host = settings.authority, settings.v1_issuer_host
    if issuer is not None:
        await asyncio.to_thread(issuer.start)
        stack.callback(issuer.stop)
        authority = v1_host = issuer.base_url

    app_verifier = verifier
    if app_verifier is None:
        from gateway.auth.entra import EntraVerifier

        app_verifier = EntraVerifier(
            authority=authority, audiences=settings.audiences, tenant_allowed=app_policy.tenant_known,
            v1_issuer_host=v1_host, leeway_s=settings.token_leeway_s, jwks_ttl_s=settings.jwks_ttl_s,
            unknown_kid_window_s=settings.jwks_refetch_window_s, max_token_bytes=settings.max_token_bytes,
            http_timeout_s=settings.jwks_timeout_s, http_connect_timeout_s=settings.jwks_connect_timeout_s,
            jwks_retry_s=settings.jwks_retry_s,
        )
        stack.push_async_callback(app_verifier.aclose)
    await app_verifier.start()
    metrics.jwks_key_sets_missing.set_function(app_verifier.key_sets_missing)

    models, app_backend = await build_models(settings, metrics, stack, backend, encoder)
    if app_backend is not None:
        await app_backend.start()
    router = Router(max_attempts=settings.route_max_attempts, breaker_failures=settings.breaker_failures,
                    breaker_open_s=settings.breaker_open_s, load_factor=settings.route_load_factor,
                    metrics=metrics)

    app_limiter = limiter or build_limiter(settings)
    if limiter is None:
        stack.push_async_callback(app_limiter.aclose)

    responses_store = build_responses_store(settings)
    if responses_store is not None:
        stack.push_async_callback(responses_store.aclose)

    app_audit = build_audit(settings, metrics)
    stack.callback(app_audit.close)
    stack.push_async_callback(app_audit.drain)  # runs first: pending records, then the close

    gateway = Gateway(
        settings=settings, verifier=app_verifier, policy=app_policy, backend=app_backend,
        limiter=app_limiter, audit=app_audit, models=models, router=router, responses_store=responses_store,
        metrics=metrics, issuer=issuer, started=int(time.time()),
    )
    stack.push_async_callback(_settle_pending, gateway)  # before the quota store closes
    return gateway


def create_app(settings: Settings | None = None, *, backend: InferenceBackend | None = None,
               policy: PolicyEngine | None = None, verifier=None, metrics: GatewayMetrics | None = None,
               limiter: Limiter | None = None, encoder: EncoderBackend | None = None,
               tracing=None, issuer: DevIssuer | None = None) -> FastAPI:
    """`tracing`: an OpenTelemetry TracerProvider of the caller's (kept open); by default one from
    the OTEL_* environment, or none (tracing off) without an OTLP endpoint. `issuer`: the development
    issuer that settings.dev_issuer asks for (`serve --dev` builds it, devkit.cli.create_dev_app); the
    app starts it, trusts only it and stops it. The product never builds one."""
    settings = settings or Settings()
    if (issuer is not None) != settings.dev_issuer:
        raise ValueError("a development issuer is passed in exactly when settings.dev_issuer is set "
                         "(`tenantgate serve --dev` does both)")
    app_metrics = metrics or GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with AsyncExitStack() as stack:
            provider = tracing or tracer_provider()
            if provider is not None:
                app.state.tracer = provider.get_tracer(TRACER_NAME)
                if tracing is None:
                    # Last out: the spans of the requests shutdown waited for are flushed too.
                    stack.push_async_callback(asyncio.to_thread, provider.shutdown)
            app.state.gateway = await build_gateway(settings, stack, metrics=app_metrics, backend=backend,
                                                    policy=policy, verifier=verifier, limiter=limiter,
                                                    encoder=encoder, issuer=issuer)
            app.state.mcp = await build_mcp(app.state.gateway, stack, getattr(app.state, "tracer", None))
            if settings.metrics_port:
                from gateway.operator import OperatorListener, operator_app

                listener = OperatorListener(operator_app(app.state.gateway, asyncio.get_running_loop()),
                                            settings.metrics_host, settings.metrics_port, settings.edge_limits)
                port = await asyncio.to_thread(listener.start)
                stack.callback(listener.close)
                logger.info("metrics on http://%s:%d/metrics", settings.metrics_host, port)
            freeze_startup_heap()
            yield

    # The API's description is for development; in production the API port serves the API only
    # (no /openapi.json, and so no /docs or /redoc).
    openapi_url = "/openapi.json" if settings.environment == "development" else None
    app = _GatewayApp(title="tenantgate", version="0.1.0", lifespan=lifespan, openapi_url=openapi_url,
                      telemetry=NO_NATIVE_TELEMETRY,
                      description="A zero-trust, policy-as-code gateway for multi-tenant LLM inference "
                                  "(OpenAI-compatible; every call carries a Microsoft Entra ID access token).")
    install_handlers(app)

    @app.exception_handler(ClientGone)
    async def _client_gone(request, exc) -> Response:
        return Response(status_code=499)

    from gateway import health
    from gateway.openai.chat.router import router as chat_router
    from gateway.openai.completions.router import router as completions_router
    from gateway.openai.embeddings.router import router as embeddings_router
    from gateway.openai.models.router import router as models_router
    from gateway.openai.responses_api.router import router as responses_router

    openai_routers = [chat_router, completions_router, embeddings_router, models_router, responses_router]
    for router in [health.router, *openai_routers]:
        app.include_router(router)
    app.include_router(mcp_router)
    app.add_middleware(PlainRoutes, fastapi_app=app, routers=openai_routers,
                       request_routers=(mcp_router,))  # innermost of ours
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=app_metrics)
    app.add_middleware(RequestTracing)
    app.add_middleware(RequestsBeforeShutdown)
    return app
