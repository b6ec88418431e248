"""POST /v1/responses: OpenAI's Responses API with function tools but without its built-in tools, and
its translation into the chat request that runs it (one conversation, one answer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from gateway.openai.chat.protocol import MAX_MESSAGES
from gateway.openai.protocol import JsonObject, JsonObjects, RequestModel


class InputText(RequestModel):
    type: Literal["input_text"]
    text: str


class OutputText(RequestModel):
    """An assistant's earlier answer, as the SDK hands back a response's output."""

    type: Literal["output_text"]
    text: str
    annotations: JsonObjects = []
    logprobs: JsonObjects | None = None


class MessageItem(RequestModel):
    """A message of the conversation: the short form ({role, content}) or an item with type
    "message" (an earlier response's output message carries id and status)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[list[InputText | OutputText], Field(min_length=1)]
    id: Annotated[str, Field(max_length=256)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @model_validator(mode="after")
    def _parts_for_role(self) -> MessageItem:
        # OpenAI's rule: output_text is what an assistant said; the other roles send input_text.
        if isinstance(self.content, list) and self.role != "assistant" and any(
                part.type == "output_text" for part in self.content):
            raise ValueError(f"a {self.role} message's content parts must be input_text")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content


class FunctionCallItem(RequestModel):
    """A function call the model made (an earlier response's function_call output item)."""

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: str
    id: Annotated[str, Field(max_length=256)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def chat_message(self) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}]}


class FunctionCallOutputItem(RequestModel):
    """What the caller's function returned for a call, by its call_id."""

    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    output: str
    id: Annotated[str, Field(max_length=256)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def chat_message(self) -> dict:
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.output}


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                      Discriminator(lambda item: item.get("type", "message") if isinstance(item, dict)
                                    else getattr(item, "type", None))]


class FunctionTool(RequestModel):
    """The Responses API's function tool: flat, where chat nests it under `function`."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None

    def chat_tool(self) -> dict:
        return {"type": "function", "function": self.model_dump(exclude={"type"}, exclude_none=True)}


class TextConfig(RequestModel):
    format: JsonObject | None = None  # {"type": "text"}, "json_object" or "json_schema" (flat, as the API has it)
    verbosity: Literal["medium"] | None = None  # the one value a model without the knob honours


# `include` values this gateway honours: the output text's logprobs, and reasoning.encrypted_content,
# which is vacuous here (there are no reasoning items; the Agents SDK asks for it with store: false).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDABLE = frozenset({LOGPROBS_INCLUDE, "reasoning.encrypted_content"})
# OpenAI's other values: each names output of a built-in tool or an input image, neither of which is here.
NOT_INCLUDABLE = frozenset({"file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                            "message.input_image.image_url", "computer_call_output.output.image_url",
                            "code_interpreter_call.outputs"})


class ResponsesRequest(RequestModel):
    model: Annotated[str, Field(min_length=1, max_length=256)]
    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: str | JsonObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool | None = None
    previous_response_id: Annotated[str, Field(max_length=64)] | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    include: Annotated[list[str], Field(max_length=16)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # with include's logprobs

    @field_validator("include")
    @classmethod
    def _includable(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            if item in NOT_INCLUDABLE:  # one of OpenAI's names, safe to repeat
                raise ValueError(f"{item} cannot be included here: the gateway has no built-in tools and "
                                 "takes no input images; the values it honours are " + ", ".join(sorted(INCLUDABLE)))
            if item not in INCLUDABLE:
                raise ValueError("not a value include takes; the values honoured here are "
                                 + ", ".join(sorted(INCLUDABLE)))
        return value

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value):
        # The built-in tools (web_search, file_search, ...) run on OpenAI's side; there is none here.
        if isinstance(value, list):
            for tool in value:
                if isinstance(tool, dict) and tool.get("type") != "function":
                    raise ValueError("only function tools are supported here, not the built-in tools "
                                     "(web_search, file_search, ...)")
        return value

    def input_items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem]:
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input

    def conversation(self) -> list[dict]:
        """The input items as chat messages (what a stored response keeps, with its answer): function
        calls as an assistant's tool_calls, their outputs as tool messages."""
        return [{"role": item.role, "content": item.text()} if isinstance(item, MessageItem) else item.chat_message()
                for item in self.input_items()]

    def chat_body(self, previous: Sequence[dict] = ()) -> tuple[dict, list[tuple]]:
        """The chat request (wire names) that runs this one after the `previous` conversation
        (a stored response's), and for each of its messages where it came from here (for the
        errors that chat's checks find). As OpenAI does, earlier instructions are not carried over."""
        messages: list[dict] = []
        origins: list[tuple] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
            origins.append(("instructions",))
        messages += list(previous)
        origins += [("previous_response_id",)] * len(previous)
        messages += self.conversation()
        origins += [("input",)] if isinstance(self.input, str) else [("input", i) for i in range(len(self.input))]
        body = {"model": self.model, "messages": messages, "stream": self.stream,
                "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "parallel_tool_calls": self.parallel_tool_calls, "user": self.user,
                "metadata": self.metadata}
        if self.wants_logprobs:
            body |= {"logprobs": True, "top_logprobs": self.top_logprobs or 0}
        if self.tools:
            body["tools"] = [tool.chat_tool() for tool in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.format is not None:
            body["response_format"] = chat_response_format(self.text.format)
        return {k: v for k, v in body.items() if v is not None}, origins


def chat_tool_choice(choice: str | dict) -> str | dict:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def chat_response_format(text_format: dict) -> dict:
    """text.format's json_schema is flat ({type, name, schema, strict}); chat's nests it."""
    if text_format.get("type") != "json_schema":
        return text_format
    return {"type": "json_schema", "json_schema": {k: v for k, v in text_format.items() if k != "type"}}
