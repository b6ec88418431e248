"""The MCP servers file: the upstream MCP servers the gateway fronts, each at /mcp/{name}.

Declared like deployments (gateway/deployments/config.py): a JSON file, strict, each server with its
URL, the gateway's own credential for it (an API key from a file or the environment, or an Entra
scope through azure-identity), its timeouts and the largest result the gateway reads from it.
The caller's token is never among these: the gateway calls each server as itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.deployments.config import read_json_file, validation_problems
from gateway.mcp.exceptions import McpConfigError

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
MAX_RESULT_BYTES_CEILING = 64 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class McpServer(_Strict):
    name: Name
    url: str
    api_key_env: str | None = None  # an environment variable holding the server's API key
    api_key_file: Path | None = None  # a mounted secret, read again when it rotates
    entra_scope: str | None = None  # an Entra token for this scope (workload or managed identity)
    timeout_s: float = Field(30.0, gt=0, le=600)  # a whole call: connect, send, the result read
    connect_timeout_s: float = Field(5.0, gt=0, le=60)
    max_result_bytes: int = Field(1 << 20, ge=1024, le=MAX_RESULT_BYTES_CEILING)  # read no more from it
    tools_ttl_s: float = Field(30.0, ge=0, le=3600)  # a call re-lists the tools (and their digests) when older

    @property
    def dialect(self) -> None:
        """The credentials' dialect (gateway/deployments/credentials.py): none, so a key is sent as a
        bearer token, as MCP's authorization spec has it."""
        return None

    @model_validator(mode="after")
    def _checked(self) -> Self:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"{self.url!r} is not an http(s) URL")
        given = [n for n in ("api_key_env", "api_key_file", "entra_scope") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"at most one credential per server; given {', '.join(given)}")
        return self


class McpServersFile(_Strict):
    servers: list[McpServer]

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        names = [s.name for s in self.servers]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"server names must be unique; repeated: {', '.join(duplicated)}")
        return self


def parse_servers(document: str | bytes) -> McpServersFile:
    try:
        return McpServersFile.model_validate_json(document)
    except ValidationError as exc:
        raise McpConfigError(f"invalid MCP servers: {validation_problems(exc)}") from None


def load_servers(path: Path) -> McpServersFile:
    return parse_servers(read_json_file(path, "MCP servers file", McpConfigError))
