"""POST /v1/embeddings: OpenAI's body. Input is a text, texts, token ids, or lists of token ids."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict

from gateway.openai.protocol import RequestModel

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request

TokenIds = Annotated[list[Annotated[int, Strict(), Field(ge=0)]], Field(min_length=1)]


class EmbeddingRequest(RequestModel):
    model: Annotated[str, Field(min_length=1, max_length=256)]
    input: (str
            | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
            | TokenIds
            | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)])
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    def texts(self) -> list[str] | None:
        """The inputs as texts; None when they are token ids."""
        if isinstance(self.input, str):
            return [self.input]
        return list(self.input) if isinstance(self.input[0], str) else None

    def token_ids(self) -> list[list[int]] | None:
        """The inputs as token ids; None when they are texts."""
        if isinstance(self.input, str) or isinstance(self.input[0], str):
            return None
        return [list(self.input)] if isinstance(self.input[0], int) else [list(ids) for ids in self.input]
