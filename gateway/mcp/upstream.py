"""The gateway's own MCP client to one upstream server: one session of the gateway's, opened with
the gateway's credential for that server, never the caller's token.

Thin and bounded: requests and responses are JSON-RPC over Streamable HTTP (2025-11-25, the
handshake revision every server of the `mcp` package speaks), the response read as JSON or as an
SSE stream up to the server's max_result_bytes and within its timeout; notifications the server
sends on a response stream (progress, logging) are dropped. A session the server has forgotten
(404) is opened again once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import cast

from gateway.deployments.config import Deployment
from gateway.deployments.credentials import Credentials
from gateway.deployments.http1 import BodyTooLarge, Http1Client, HttpError, Response
from gateway.mcp.config import McpServer
from gateway.mcp.exceptions import JsonRpcError, UpstreamFailed

logger = logging.getLogger("tenantgate.mcp")

UPSTREAM_PROTOCOL_VERSION = "2025-11-25"
CLIENT_INFO = {"name": "tenantgate", "version": "0.1.0"}
KEEPALIVE_EXPIRY_S = 2.0  # under the servers' own keep-alive (uvicorn: 5 s), as the deployments' client


class ResultTooLarge(Exception):
    """The server's answer passed max_result_bytes before it ended."""


class Upstream:
    def __init__(self, server: McpServer, *, entra_credential=None) -> None:
        self.server = server
        # The deployments' credentials (API key file read again when it rotates, Entra tokens renewed
        # before they expire) serve an MCP server the same way: it has the fields they read.
        self._credentials = Credentials(cast(Deployment, server), entra_credential)
        # The deployments' lean HTTP/1.1 client: httpx cost about a millisecond a call on this path.
        self._client = Http1Client(connect_timeout_s=server.connect_timeout_s, io_timeout_s=server.timeout_s,
                                   keepalive_expiry_s=KEEPALIVE_EXPIRY_S)
        self._session_id: str | None = None
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._ids = itertools.count(1)

    @property
    def name(self) -> str:
        return self.server.name

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._credentials.aclose()

    async def _headers(self) -> dict[str, str]:
        # identity: the size bound counts the bytes as they arrive, which a compressed body would escape.
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                   "accept-encoding": "identity",
                   "mcp-protocol-version": UPSTREAM_PROTOCOL_VERSION}
        headers.update(await self._credentials.headers())
        if self._session_id is not None:
            headers["mcp-session-id"] = self._session_id
        return headers

    async def _open(self) -> None:
        if self._opened:  # the usual case, without the lock
            return
        async with self._open_lock:
            if self._opened:
                return
            self._session_id = None
            init = {"protocolVersion": UPSTREAM_PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
            _, headers = await self._exchange("initialize", init)
            self._session_id = headers.get("mcp-session-id")
            await self._notify("notifications/initialized")
            self._opened = True

    async def request(self, method: str, params: dict, *, max_bytes: int | None = None) -> tuple[dict, int]:
        """The result of one request, and the bytes of the response it came in. Raises JsonRpcError with
        the server's own error object when it answers one, UpstreamFailed when it fails or exceeds its
        bounds, ResultTooLarge past max_bytes."""
        await self._open()
        try:
            return await self._result(method, params, max_bytes)
        except _SessionGone:
            async with self._open_lock:
                self._opened = False
            await self._open()
            return await self._result(method, params, max_bytes)

    async def _result(self, method: str, params: dict, max_bytes: int | None) -> tuple[dict, int]:
        (message, size), _ = await self._exchange(method, params, max_bytes)
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            code, text = error.get("code"), error.get("message")
            raise JsonRpcError(code if isinstance(code, int) else -32603,
                               text[:1024] if isinstance(text, str) else "the MCP server answered an error")
        result = message.get("result")
        if not isinstance(result, dict):
            raise UpstreamFailed(f"MCP server {self.name} answered without a result")
        return result, size

    async def _notify(self, method: str) -> None:
        body = json.dumps({"jsonrpc": "2.0", "method": method}).encode()
        try:
            async with asyncio.timeout(self.server.timeout_s):
                response = await self._client.send("POST", self.server.url, await self._headers(), body)
                try:
                    async for _ in _bounded_chunks(response, self.server.max_result_bytes):
                        pass
                finally:
                    await response.aclose()
        except (TimeoutError, HttpError, ResultTooLarge) as exc:
            raise UpstreamFailed(f"MCP server {self.name} is unreachable ({type(exc).__name__})") from None

    async def _exchange(self, method: str, params: dict,
                        max_bytes: int | None = None) -> tuple[tuple[dict, int], dict[str, str]]:
        limit = min(max_bytes or self.server.max_result_bytes, self.server.max_result_bytes)
        request_id = next(self._ids)
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()
        try:
            async with asyncio.timeout(self.server.timeout_s):
                response = await self._client.send("POST", self.server.url, await self._headers(), body)
                try:
                    if response.status_code == 404 and self._session_id is not None and method != "initialize":
                        raise _SessionGone()
                    content_type = response.headers.get("content-type", "").lower()
                    if response.status_code >= 400 and not content_type.startswith("application/json"):
                        raise UpstreamFailed(f"MCP server {self.name} answered HTTP {response.status_code}")
                    if content_type.startswith("text/event-stream"):
                        found = await _from_sse(response, request_id, limit)
                    elif content_type.startswith("application/json"):
                        found = await _from_json(response, limit)
                    else:
                        raise UpstreamFailed(f"MCP server {self.name} answered with an unexpected content type")
                    return found, response.headers
                finally:
                    await response.aclose()
        except TimeoutError:
            raise UpstreamFailed(f"MCP server {self.name} did not answer within {self.server.timeout_s:g} s") from None
        except HttpError as exc:
            raise UpstreamFailed(f"MCP server {self.name} is unreachable ({type(exc).__name__})") from None


class _SessionGone(Exception):
    pass


async def _bounded_chunks(response: Response, limit: int):
    read = 0
    async for chunk in response.aiter_bytes():
        read += len(chunk)
        if read > limit:
            raise ResultTooLarge()
        yield chunk


async def _from_json(response: Response, limit: int) -> tuple[dict, int]:
    try:
        body = await response.aread(limit)
    except BodyTooLarge:
        raise ResultTooLarge() from None
    try:
        message = json.loads(body)
    except ValueError:
        raise UpstreamFailed("the MCP server answered with a body that is not JSON") from None
    if not isinstance(message, dict):
        raise UpstreamFailed("the MCP server answered with a body that is not a JSON-RPC message")
    return message, len(body)


async def _from_sse(response: Response, request_id: int, limit: int) -> tuple[dict, int]:
    """The response to request_id from an SSE stream; everything else on it is dropped. The whole
    stream counts against the limit, so a server cannot stream notifications without end."""
    buffer = b""
    async for chunk in _bounded_chunks(response, limit):
        buffer += chunk
        while True:
            end = _event_end(buffer)
            if end is None:
                break
            event, buffer = buffer[:end[0]], buffer[end[1]:]
            data = b"\n".join(line[5:].lstrip(b" ") for line in event.replace(b"\r\n", b"\n").split(b"\n")
                              if line.startswith(b"data:"))
            if not data:
                continue
            try:
                message = json.loads(data)
            except ValueError:
                raise UpstreamFailed("the MCP server sent an event that is not JSON") from None
            if isinstance(message, dict) and message.get("id") == request_id and ("result" in message
                                                                                   or "error" in message):
                return message, len(data)
    raise UpstreamFailed("the MCP server's stream ended without a response")


def _event_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first SSE event ends (a blank line), and where the next begins."""
    found = [(at, at + len(separator)) for separator in (b"\r\n\r\n", b"\n\n", b"\r\r")
             if (at := buffer.find(separator)) >= 0]
    return min(found) if found else None
