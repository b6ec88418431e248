"""What the MCP endpoint raises: configuration errors at start-up, and JSON-RPC errors that end one
message with the error object the spec names (never a 500, never the caller's text echoed back)."""

from __future__ import annotations

# JSON-RPC 2.0's codes, and the server range MCP uses.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Server-defined codes of this gateway (-32000 to -32099).
UPSTREAM_ERROR = -32002  # the MCP server failed, timed out or answered beyond its bounds
RATE_LIMITED = -32003  # a tool's budget is spent (HTTP 429, Retry-After)
POLICY_UNAVAILABLE = -32004  # the policy could not decide (fail closed)
RESULT_TOO_LARGE = -32005  # the result exceeds what the policy lets the caller have


class McpConfigError(ValueError):
    """The MCP servers file is missing, not JSON, or invalid."""


class JsonRpcError(Exception):
    """Ends one message: the JSON-RPC error object, the HTTP status it travels with, extra headers."""

    def __init__(self, code: int, message: str, *, status: int = 200, data: object = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.data = data
        self.headers = headers or {}

    def error(self) -> dict:
        error: dict = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class UpstreamFailed(JsonRpcError):
    def __init__(self, message: str) -> None:
        super().__init__(UPSTREAM_ERROR, message, status=502)
