"""What every OpenAI route documents: its error responses, in OpenAI's shape."""

from typing import Any

from gateway.openai.protocol import ErrorResponse

# FastAPI's `responses` type: status (or "default") -> the response's OpenAPI fields.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request body"},
    401: {"model": ErrorResponse, "description": "Missing or invalid Entra ID access token"},
    403: {"model": ErrorResponse, "description": "Denied by policy"},
    404: {"model": ErrorResponse, "description": "Model not served"},
    413: {"model": ErrorResponse, "description": "Body too large"},
    429: {"model": ErrorResponse, "description": "Rate limited"},
    503: {"model": ErrorResponse, "description": "Policy or engine unavailable"},
}
