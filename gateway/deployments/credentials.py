"""An OpenAI-compatible deployment's credential: an API key (from a mounted file, read again when
it rotates, or the environment) or an Entra token (workload or managed identity), as headers."""


from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gateway.deployments.base import (
    UpstreamUnavailable,
)
from gateway.deployments.config import Deployment

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken

logger = logging.getLogger("tenantgate.gateway.upstream")

TOKEN_REFRESH_MARGIN_S = 300  # an Entra token is renewed this long before it expires


class _KeyFile:
    """A mounted secret, read again when its modification time changes (rotation)."""

    def __init__(self, deployment: Deployment) -> None:
        # Made only for a deployment with an api_key_file.
        self.path, self.name = cast(Path, deployment.api_key_file), deployment.name
        self._stamp: int | None = None
        self._key = ""
        self.read()

    def read(self) -> str:
        try:
            stamp = self.path.stat().st_mtime_ns
            if stamp != self._stamp:
                self._key, self._stamp = self.path.read_text().strip(), stamp
        except OSError:
            raise UpstreamUnavailable(f"deployment {self.name}: its API key file cannot be read") from None
        if not self._key:
            raise UpstreamUnavailable(f"deployment {self.name}: its API key file is empty")
        return self._key


class Credentials:
    """The deployment's credential as request headers. Values are never logged or put in errors."""

    def __init__(self, deployment: Deployment, entra_credential=None) -> None:
        self.deployment = deployment
        self._key_file = _KeyFile(deployment) if deployment.api_key_file is not None else None
        self._env_key = None
        if deployment.api_key_env is not None:
            self._env_key = os.environ.get(deployment.api_key_env, "").strip()
            if not self._env_key:
                raise ValueError(f"deployment {deployment.name}: environment variable "
                                 f"{deployment.api_key_env} is not set")
        self._entra = entra_credential
        self._owns_entra = False
        self._token: AccessToken | None = None
        self._token_lock = asyncio.Lock()

    async def headers(self) -> dict[str, str]:
        deployment = self.deployment
        if deployment.entra_scope is not None:
            return {"authorization": f"Bearer {await self._entra_token()}"}
        key = self._key_file.read() if self._key_file is not None else self._env_key
        if key is None:
            return {}
        if deployment.dialect == "azure-openai":
            return {"api-key": key}
        return {"authorization": f"Bearer {key}"}

    async def _entra_token(self) -> str:
        async with self._token_lock:
            if self._token is None or self._token.expires_on - TOKEN_REFRESH_MARGIN_S <= time.time():
                if self._entra is None:
                    from azure.identity.aio import DefaultAzureCredential  # workload or managed identity

                    self._entra, self._owns_entra = DefaultAzureCredential(), True
                try:
                    self._token = await self._entra.get_token(self.deployment.entra_scope)
                except Exception:  # noqa: BLE001 - azure-identity raises many kinds; none is the caller's
                    raise UpstreamUnavailable(f"deployment {self.deployment.name}: no Entra token") from None
            return self._token.token

    async def aclose(self) -> None:
        if self._owns_entra:
            await self._entra.close()


