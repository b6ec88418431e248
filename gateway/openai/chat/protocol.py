"""POST /v1/chat/completions: the request body (OpenAI's, minus what the engine cannot do)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.openai.chat.tools import (
    MAX_TOOLS,
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolChoice,
    render_calls,
    system_prompt,
)
from gateway.openai.closed_schemas import check_strict, closed
from gateway.openai.protocol import JsonObject, RequestModel, SamplingFields

MAX_MESSAGES = 2048


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class Message(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_call_id: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None  # an assistant's
    # What OpenAI's own assistant messages carry, so an answer can be sent back as it came
    # (`messages.append(choice.message)`, or its model_dump()). A refusal is what the assistant
    # said; annotations (citations) describe its content and are dropped; audio and a legacy
    # function_call can only be null, as the gateway answers them.
    refusal: str | None = None
    annotations: list[dict] | None = Field(default=None, exclude=True)
    audio: None = None
    function_call: None = None

    @model_validator(mode="after")
    def _an_assistants_fields(self) -> Message:
        for name in ("tool_calls", "refusal", "annotations"):
            if getattr(self, name) is not None and self.role != "assistant":
                raise ValueError(f"only assistant messages carry {name}")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or self.refusal or ""


class ResponseFormatText(RequestModel):
    type: Literal["text"]


class ResponseFormatJsonObject(RequestModel):
    type: Literal["json_object"]


class JsonSchema(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    # OpenAI's field is `schema`; pydantic reserves the name on models, hence the alias.
    json_schema: JsonObject | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not

    @model_validator(mode="after")
    def _strict(self) -> JsonSchema:
        check_strict(self.json_schema, self.strict, f"response_format '{self.name}'")
        return self


class ResponseFormatJsonSchema(RequestModel):
    type: Literal["json_schema"]
    json_schema: JsonSchema


ResponseFormat = Annotated[ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
                           Field(discriminator="type")]


def schema_of(response_format: ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema | None
              ) -> str | None:
    """The JSON schema (as JSON text) the answer must match; None for free text. json_object is any
    object; a json_schema without a schema any JSON value; a schema's objects are closed where it
    leaves extra keys unsaid (gateway/openai/closed_schemas.py)."""
    if isinstance(response_format, ResponseFormatJsonObject):
        return '{"type": "object"}'
    if isinstance(response_format, ResponseFormatJsonSchema):
        schema = response_format.json_schema.json_schema
        return json.dumps({} if schema is None else closed(schema), ensure_ascii=False, separators=(",", ":"))
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
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_completion_tokens or max_tokens, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: each function needs a name of its own")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError("tool_choice names a function that is not among the tools")
        if self.n > 1 and self.active_tools:
            raise ValueError("n > 1 cannot go with tools: the gateway reads one choice's tool calls")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def active_tools(self) -> list[Tool]:
        """The tools the model is shown: none with tool_choice none."""
        return [] if self.tool_choice == "none" else list(self.tools or [])

    @property
    def constrains_tool_call(self) -> bool:
        return bool(self.tools) and (self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice))

    @property
    def parallel_calls(self) -> bool:
        """Whether an answer may make several tool calls (OpenAI's default; false: at most one)."""
        return self.parallel_tool_calls is not False

    @property
    def reads_calls_as_generated(self) -> bool:
        """Whether the answer is free text in which tool calls may appear: tools shown, and `auto`."""
        return bool(self.active_tools) and self.tool_choice in (None, "auto")

    def template_messages(self, tools_in_system: bool = False) -> list[dict]:
        """The conversation for the chat template; with tools_in_system (a template without a tools
        section) the active tools go first, in a system message (gateway/openai/chat/tools.py)."""
        rendered = []
        tools_prompt = system_prompt(self.active_tools) if tools_in_system and self.active_tools else None
        for i, message in enumerate(self.messages):
            # Chat templates know system, user and assistant; developer is OpenAI's new name for system.
            role = "system" if message.role == "developer" else message.role
            text = message.text() + (render_calls(message.tool_calls) if message.tool_calls else "")
            if i == 0 and tools_prompt is not None:
                if role == "system":  # one system message: the caller's, then the tools
                    rendered.append({"role": "system", "content": text + "\n\n" + tools_prompt})
                    continue
                rendered.append({"role": "system", "content": tools_prompt})
            entry = {"role": role, "content": text}
            if message.tool_call_id is not None:
                entry["tool_call_id"] = message.tool_call_id
            rendered.append(entry)
        return rendered
