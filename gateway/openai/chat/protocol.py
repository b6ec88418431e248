"""POST /v1/chat/completions: the request body (OpenAI's, minus what the engine cannot do)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.openai.protocol import RequestModel, SamplingFields

MAX_MESSAGES = 2048


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class Message(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ResponseFormatText(RequestModel):
    type: Literal["text"]


class ResponseFormatJsonObject(RequestModel):
    type: Literal["json_object"]


class JsonSchema(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    # OpenAI's field is `schema`; pydantic reserves the name on models, hence the alias.
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not


class ResponseFormatJsonSchema(RequestModel):
    type: Literal["json_schema"]
    json_schema: JsonSchema


ResponseFormat = Annotated[ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
                           Field(discriminator="type")]


def schema_of(response_format: ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema | None
              ) -> str | None:
    """The JSON schema (as JSON text) the answer must match; None for free text. json_object is any
    object; a json_schema without a schema any JSON value."""
    if isinstance(response_format, ResponseFormatJsonObject):
        return '{"type": "object"}'
    if isinstance(response_format, ResponseFormatJsonSchema):
        schema = response_format.json_schema.json_schema
        return json.dumps({} if schema is None else schema, ensure_ascii=False, separators=(",", ":"))
    return None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ChatCompletionRequest":
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_completion_tokens or max_tokens, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict]:
        rendered = []
        for message in self.messages:
            # Chat templates know system, user and assistant; developer is OpenAI's new name for system.
            role = "system" if message.role == "developer" else message.role
            entry = {"role": role, "content": message.text()}
            if message.tool_call_id is not None:
                entry["tool_call_id"] = message.tool_call_id
            rendered.append(entry)
        return rendered
