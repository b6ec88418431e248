"""Remote targets: one per tenantgate engine replica, one per OpenAI-compatible deployment (the
engines in this process are targets themselves: gateway/inference.py)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator

from engine import ExecutionEnvelope, Isolation, RequestOutput
from gateway.background import BackgroundTask
from gateway.deployments.base import Embeddings, ReplicaLoad, RunRequest, UpstreamCall, UpstreamUnavailable
from gateway.deployments.config import Deployment
from gateway.deployments.dialects import unmet_cache_scope
from gateway.deployments.openai_compatible import OpenAIUpstream
from gateway.deployments.replica_client import ReplicaClient

logger = logging.getLogger("tenantgate.gateway")

NOT_BATCH_INVARIANT = ("this tenant's deterministic lane needs a batch-invariant deployment, "
                       "and no deployment of this model is declared one")
NOT_DEDICATED = ("this tenant's {isolation} batch isolation needs a deployment dedicated to it, "
                 "and no deployment of this model is")
# OpenAI's own APIs, whose embedding models' tokenizer is cl100k_base: they take its ids as sent.
CL100K_DIALECTS = ("openai", "azure-openai")


class ReplicaTarget:
    """One `tenantgate engine serve` replica: its engine enforces every decision itself."""

    expects_records: bool = True
    remote: bool = True  # called over HTTP, with the trace's traceparent

    def __init__(self, name: str, replica: ReplicaClient) -> None:
        self.name = name
        self.replica = replica
        self.fingerprint = "unknown"  # the replica's, once it has answered /v1/engine/info
        self.max_model_len: int | None = None
        self._load: ReplicaLoad | None = None
        self._ready = False

    def unmet(self, envelope: ExecutionEnvelope, tenant_id: str) -> str | None:
        return None

    def run(self, request: RunRequest) -> AsyncIterator[RequestOutput]:
        if request.params is None:
            raise ValueError("a replica generates: its request carries sampling params")
        return self.replica.generate(request.token_ids, request.params, request.envelope, request.request_id,
                                     headers=request.headers)

    def engine_record(self, request_id: str):
        return self.replica.engine_record(request_id)

    def reported_load(self) -> ReplicaLoad | None:
        return self._load

    def ready(self) -> bool:
        return self._ready

    async def aclose(self) -> None:
        await self.replica.aclose()

    async def poll(self) -> None:
        """Reads the replica's load (and, until it has it, its info); a failure marks it not ready."""
        try:
            if self.fingerprint == "unknown":
                info = await self.replica.info()
                self.fingerprint = str(info.get("fingerprint") or "unknown")
                length = info.get("max_model_len")
                self.max_model_len = length if type(length) is int and length > 0 else None
            self._load = await self.replica.load()
            self._ready = True
        except UpstreamUnavailable as exc:
            if self._ready:
                logger.warning("engine replica %s is not answering: %s", self.name, exc)
            self._ready, self._load = False, None


class UpstreamTarget:
    """One OpenAI-compatible deployment. It honours a decision only as far as it is declared to:
    batch-invariant for the deterministic lane, dedicated to the tenant for tenant or exclusive
    isolation, and a cache scope its dialect can keep apart (gateway/deployments/dialects.py)."""

    expects_records: bool = False
    max_model_len: int | None = None  # the deployment's context_tokens, when declared, caps its model
    remote: bool = True

    def __init__(self, deployment: Deployment, upstream: OpenAIUpstream) -> None:
        self.name = deployment.name
        self.deployment = deployment
        self.upstream = upstream
        identity = f"{deployment.dialect}\0{deployment.url}\0{deployment.upstream_model or ''}"
        self.fingerprint = "upstream-" + hashlib.sha256(identity.encode()).hexdigest()[:16]

    def unmet(self, envelope: ExecutionEnvelope, tenant_id: str) -> str | None:
        if envelope.deterministic and not self.deployment.batch_invariant:
            return NOT_BATCH_INVARIANT
        if envelope.isolation is not Isolation.SHARED and self.deployment.dedicated_tenants != [tenant_id]:
            return NOT_DEDICATED.format(isolation=envelope.isolation.value)
        return unmet_cache_scope(self.deployment, envelope, tenant_id)

    def _call(self, request: RunRequest) -> UpstreamCall:
        body = request.body
        if request.embed_texts is not None and self.deployment.dialect not in CL100K_DIALECTS:
            body = body | {"input": request.embed_texts}  # cl100k ids its model would misread
        return UpstreamCall(route=request.route, body=body, max_tokens=request.max_tokens, envelope=request.envelope,
                            request_id=request.request_id, tenant_id=request.tenant_id, headers=request.headers)

    def run(self, request: RunRequest) -> AsyncIterator[RequestOutput]:
        return self.upstream.stream(self._call(request))

    async def embed(self, request: RunRequest) -> Embeddings:
        return await self.upstream.embed(self._call(request))

    def engine_record(self, request_id: str):
        return None

    def reported_load(self) -> ReplicaLoad | None:
        return None

    def ready(self) -> bool:
        return True  # its breaker says otherwise

    async def aclose(self) -> None:
        await self.upstream.aclose()


class LoadPoller:
    """Reads every replica's load in the background, every `interval_s`."""

    def __init__(self, targets: list[ReplicaTarget], interval_s: float) -> None:
        self.targets = targets
        self.interval_s = interval_s
        self._poller = BackgroundTask("tenantgate-load-poller")

    async def start(self) -> None:
        if self.targets:
            await self.poll_once()  # the first figures (and fingerprints) before the first request
            self._poller.start(self._run())

    async def poll_once(self) -> None:
        await asyncio.gather(*(target.poll() for target in self.targets))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll_once()

    async def aclose(self) -> None:
        await self._poller.stop()
