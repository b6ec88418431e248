"""The gateway's client for one tenantgate engine replica (`tenantgate engine serve`).

Each request is signed for that request alone (an envelope token bound to its id and body,
engine/remote/signing.py); the replica streams NDJSON deltas and, after the last, the
engine's x-record, which `engine_record` hands to the audit as the embedded engine does.
Which replica takes a request, and whether a failure may move to another, is the router's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import httpx

from engine import ExecutionEnvelope, PendingRecords, RequestOutput, SamplingParams
from engine.remote import (
    ENVELOPE_HEADER,
    GENERATE_PATH,
    INFO_PATH,
    LOAD_PATH,
    REJECTION_REASONS,
    EnvelopeSigner,
    output_from_json,
    params_to_json,
    record_from_json,
)
from gateway.deployments.base import (
    EnvelopeRefused,
    ReplicaLoad,
    UpstreamIdle,
    UpstreamInterrupted,
    UpstreamRejected,
    UpstreamUnavailable,
)

_MALFORMED = (ValueError, TypeError, KeyError, IndexError)


class ReplicaClient:
    expects_records = True

    def __init__(self, base_url: str, signer: EnvelopeSigner, *, connect_timeout_s: float = 2.0,
                 timeout_s: float = 300.0, first_token_timeout_s: float = 60.0, idle_timeout_s: float = 30.0,
                 name: str | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name or self.base_url  # in error messages and logs
        self._signer = signer
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._first_token_timeout_s = first_token_timeout_s
        self._idle_timeout_s = idle_timeout_s
        # The deadlines of a generate are the client's own (below); httpx's bound each read.
        self._client = httpx.AsyncClient(base_url=self.base_url, transport=transport, trust_env=False,
                                         timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s))
        self._records = PendingRecords()

    def engine_record(self, request_id: str):
        """The replica's x-record of a request that finished, once; None before or after."""
        return self._records.pop(request_id)

    async def generate(self, token_ids: Sequence[int], params: SamplingParams, envelope: ExecutionEnvelope,
                       request_id: str, *, headers: dict[str, str] | None = None) -> AsyncIterator[RequestOutput]:
        """The replica's deltas. Closing the generator early closes the stream, which aborts the
        request there. UpstreamUnavailable (EnvelopeRefused for a 403) before or after the first
        delta, UpstreamInterrupted when the connection ended once the request may have reached
        the replica, UpstreamIdle when it went silent for idle_timeout_s after a delta,
        UpstreamRejected for a 4xx; the caller knows which deltas it has already sent."""
        body = json.dumps({"request_id": request_id, "token_ids": list(token_ids),
                           "params": params_to_json(params)}, separators=(",", ":")).encode()
        headers = (headers or {}) | {ENVELOPE_HEADER: self._signer.sign(envelope, request_id, body),
                                     "content-type": "application/json"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        first_deadline = min(deadline, loop.time() + self._first_token_timeout_s)
        request = self._client.build_request("POST", GENERATE_PATH, content=body, headers=headers)
        response = None
        started = False
        unfinished = params.n  # choices whose last delta has not come yet
        try:
            async with self._within(first_deadline, "before its first output"):
                response = await self._send(request)
                if response.status_code != 200:
                    await self._refusal(response)
            lines = response.aiter_lines()
            while True:
                async with self._next_line(deadline, first_deadline if not started else None):
                    item = _parse_line(await anext(lines, None), self.name)
                if item.get("type") == "error":
                    raise UpstreamUnavailable(f"engine replica {self.name} failed mid-stream")
                if item.get("type") != "output":
                    raise ValueError("an output line was expected")
                output = output_from_json(item, request_id)
                unfinished -= output.finished
                if not unfinished:
                    # The record follows the last delta: read it before the caller may stop reading.
                    async with self._within(deadline, "before its record"):
                        record = _parse_line(await anext(lines, None), self.name)
                    if record.get("type") != "record":
                        raise ValueError("a record line was expected")
                    self._records.request(record_from_json(record["record"]))
                    yield output
                    return
                started = True
                yield output
        except httpx.TransportError as exc:  # after the head: the replica had the request
            raise UpstreamInterrupted(f"engine replica {self.name} failed: {type(exc).__name__}") from None
        except _MALFORMED:
            raise UpstreamUnavailable(f"engine replica {self.name} sent a malformed stream") from None
        finally:
            if response is not None:
                await response.aclose()  # unread, this closes the connection: the replica aborts

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """The response head. Only a connection never made is plain UpstreamUnavailable: once the
        request may have been written, a lost connection is UpstreamInterrupted (never resent)."""
        try:
            return await self._client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise UpstreamUnavailable(f"engine replica {self.name} cannot be reached: {type(exc).__name__}") from None
        except httpx.TransportError as exc:
            raise UpstreamInterrupted(f"engine replica {self.name} closed the connection before answering: "
                                      f"{type(exc).__name__}") from None

    def _within(self, when: float, what: str):
        return _Deadline(when, f"engine replica {self.name} timed out {what}")

    def _next_line(self, deadline: float, first_deadline: float | None):
        """The bound on the next line: the first output's deadline, then idle_timeout_s after each."""
        if first_deadline is not None:
            return self._within(first_deadline, "before its first output")
        idle = asyncio.get_running_loop().time() + self._idle_timeout_s
        if idle < deadline:
            return _Deadline(idle, f"engine replica {self.name} sent nothing for {self._idle_timeout_s:g} s "
                                   "mid-stream", UpstreamIdle)
        return self._within(deadline, "mid-stream")

    async def _refusal(self, response: httpx.Response) -> None:
        await response.aread()
        try:
            error = response.json()["error"]
            message, code, param = str(error["message"]), error.get("code"), error.get("param")
        except (*_MALFORMED, json.JSONDecodeError):
            message, code, param = "the engine replica refused the request", None, None
        status = response.status_code
        if status == 403:
            reason = code if code in REJECTION_REASONS else "unknown"
            raise EnvelopeRefused(f"engine replica {self.name} refused the envelope ({reason})", reason)
        if 400 <= status < 500:
            raise UpstreamRejected(status, message, param=param if isinstance(param, str) else None,
                                   code=code if isinstance(code, str) and code else None)
        raise UpstreamUnavailable(f"engine replica {self.name} answered {status}")

    async def load(self) -> ReplicaLoad:
        document = await self._get(LOAD_PATH)
        try:
            depth, usage = document["queue_depth"], document["kv_usage"]
            if type(depth) is not int or not isinstance(usage, (int, float)) or isinstance(usage, bool):
                raise TypeError("queue_depth or kv_usage")
            return ReplicaLoad(queue_depth=depth, kv_usage=float(usage))
        except _MALFORMED:
            raise UpstreamUnavailable(f"engine replica {self.name} sent a malformed load report") from None

    async def info(self) -> dict:
        return await self._get(INFO_PATH)

    async def _get(self, path: str) -> dict:
        try:
            response = await self._client.get(path, timeout=httpx.Timeout(self._connect_timeout_s))
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise UpstreamUnavailable(f"engine replica {self.name} {path}: {type(exc).__name__}") from None
        if not isinstance(document, dict):
            raise UpstreamUnavailable(f"engine replica {self.name} {path}: not a JSON object")
        return document

    async def aclose(self) -> None:
        await self._client.aclose()


class _Deadline:
    """asyncio.timeout_at whose expiry is an UpstreamUnavailable (or `kind`) with `message`."""

    def __init__(self, when: float, message: str, kind: type[UpstreamUnavailable] = UpstreamUnavailable) -> None:
        self._timeout = asyncio.timeout_at(when)
        self._message = message
        self._kind = kind

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, *exc_info) -> bool | None:
        try:
            await self._timeout.__aexit__(*exc_info)  # asyncio.Timeout's returns None: it suppresses nothing
            return None
        except TimeoutError:
            raise self._kind(self._message) from None


def _parse_line(line: str | None, name: str) -> dict:
    if line is None:
        raise UpstreamUnavailable(f"engine replica {name}'s stream ended before the request finished")
    document = json.loads(line)
    if not isinstance(document, dict):
        raise ValueError("a stream line must be a JSON object")
    return document
