"""One JSON-RPC 2.0 message in, checked and bounded; one response out.

MCP's Streamable HTTP carries one message per POST (batches went with 2025-06-18). Anything that
is not a well-formed request or notification ends with the error the JSON-RPC spec names for it:
-32700 for bytes that are not JSON, -32600 for JSON that is not a request, -32602 for params that
are not an object. The caller's text is never echoed in an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.mcp.exceptions import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, JsonRpcError

MAX_METHOD_CHARS = 128
MAX_ID_CHARS = 256
MAX_DEPTH = 64  # of nested objects and arrays in one message: deeper input costs the parser, not the caller


@dataclass(frozen=True, slots=True)
class Message:
    method: str
    params: dict
    id: str | int | None  # None: a notification (no response)

    @property
    def notification(self) -> bool:
        return self.id is None


def _depth(value: object, limit: int) -> int:
    """The nesting of objects and arrays, counted without recursion, stopping past limit."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_message(body: bytes) -> Message:
    try:
        document = json.loads(body)
    except ValueError:
        raise JsonRpcError(PARSE_ERROR, "the body is not JSON", status=400) from None
    except RecursionError:  # the parser's own bound on nesting, reached within the size bound
        raise JsonRpcError(INVALID_REQUEST, f"the message nests deeper than {MAX_DEPTH} levels", status=400) from None
    if isinstance(document, list):
        raise JsonRpcError(INVALID_REQUEST, "JSON-RPC batches are not supported: send one message per request",
                           status=400)
    if not isinstance(document, dict) or document.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, "the body is not a JSON-RPC 2.0 message", status=400)
    # Objects and arrays cannot nest deeper than the brackets that open them (a string's count too,
    # so this over-counts): only a message with more than MAX_DEPTH of them is walked.
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(document, MAX_DEPTH) > MAX_DEPTH:
        raise JsonRpcError(INVALID_REQUEST, f"the message nests deeper than {MAX_DEPTH} levels", status=400)
    method = document.get("method")
    if "method" not in document:
        if "result" in document or "error" in document:  # a response to a server request: this gateway sends none
            raise JsonRpcError(INVALID_REQUEST, "this endpoint sends no requests, so it takes no responses",
                               status=400)
        raise JsonRpcError(INVALID_REQUEST, "the message has no method", status=400)
    if not isinstance(method, str) or not method or len(method) > MAX_METHOD_CHARS:
        raise JsonRpcError(INVALID_REQUEST, "the method must be a non-empty string", status=400)
    id_ = document.get("id")
    if "id" in document:
        too_long = isinstance(id_, str) and len(id_) > MAX_ID_CHARS
        if isinstance(id_, bool) or not isinstance(id_, str | int) or too_long:
            raise JsonRpcError(INVALID_REQUEST, "the id must be a string or an integer", status=400)
    params = document.get("params", {})
    if not isinstance(params, dict):
        raise JsonRpcError(INVALID_PARAMS, "params must be an object", status=400)
    return Message(method=method, params=params, id=id_)


def result(id_: str | int | None, value: dict) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "result": value}


def error(id_: str | int | None, exc: JsonRpcError) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "error": exc.error()}
