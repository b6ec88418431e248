"""Tool calling on the embedded engine: how the tools reach the model, how `tool_choice` constrains
its answer, and how tool calls are read back out of it (docs/api.md, "Tool calling").

A chat template with a tools section gets the tools as `tools`; one without (SmolLM2's) gets them
in a system message in the format below. Either way a call is written as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, which is also how assistant tool calls
in the history are rendered back. `required` and a named function are constrained decoding
(engine/grammar.py): the answer is JSON that matches the function's parameters schema.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.openai.closed_schemas import check_strict, closed
from gateway.openai.protocol import JsonObject, RequestModel

MAX_TOOLS = 128
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
SYSTEM_PROMPT = (
    "You can call functions. To call one, answer with only <tool_call>{{\"name\": <the function's name>, "
    "\"arguments\": <its arguments as a JSON object>}}</tool_call>.\n"
    "The functions, with a JSON schema of their arguments:\n{functions}"
)
ANY_OBJECT = {"type": "object"}


class FunctionDefinition(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None  # the parameters schema is enforced whenever the call is constrained

    @model_validator(mode="after")
    def _strict(self) -> "FunctionDefinition":
        check_strict(self.parameters, self.strict, f"function '{self.name}'")
        return self


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64)]


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: str


class ToolCall(RequestModel):
    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"]
    function: FunctionCall


def system_prompt(tools: list[Tool]) -> str:
    functions = "\n".join(json.dumps(t.function.model_dump(exclude_none=True, exclude={"strict"}), ensure_ascii=False)
                          for t in tools)
    return SYSTEM_PROMPT.format(functions=functions)


def render_calls(calls: list[ToolCall]) -> str:
    """An assistant's tool calls in the history, as the model is asked to write them."""
    return "".join(f'<tool_call>{{"name": {json.dumps(c.function.name)}, "arguments": {c.function.arguments}}}'
                   "</tool_call>" for c in calls)


def parameters(tool: Tool) -> dict:
    """The arguments' schema as constrained: closed where it leaves extra keys unsaid."""
    return closed(tool.function.parameters) if tool.function.parameters is not None else ANY_OBJECT


def constrained_schema(tools: list[Tool], choice: ToolChoice | None) -> str | None:
    """The JSON schema the answer must match: a named function's arguments, or for `required` one call
    of any function as {"name", "arguments"}; None for `auto` and `none` (free text)."""
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        return json.dumps(parameters(tool), ensure_ascii=False, separators=(",", ":"))
    if choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": t.function.name}, "arguments": parameters(t)},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
        return json.dumps({"anyOf": calls} if len(calls) > 1 else calls[0], ensure_ascii=False, separators=(",", ":"))
    return None


def new_call_id() -> str:
    return "call_" + secrets.token_urlsafe(18)


def _call(name: str, arguments: object) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": text}}


def parse_calls(text: str, tools: list[Tool], choice: ToolChoice | None) -> list[dict] | None:
    """The tool calls in an answer, as OpenAI's message.tool_calls; None when it has none (then the
    answer is content). A named choice's answer is the arguments themselves; `required`'s is one
    {"name", "arguments"} object; `auto`'s is text with <tool_call> tags, each holding one."""
    if isinstance(choice, NamedToolChoice):
        return [_call(choice.function.name, text)]
    names = {t.function.name for t in tools}
    if choice == "required":
        candidates = [text]
    elif choice == "auto" or choice is None:
        candidates = TOOL_CALL.findall(text)
    else:
        return None
    calls = []
    for candidate in candidates:
        try:
            call = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(call, dict) and call.get("name") in names and isinstance(call.get("arguments", {}), dict):
            calls.append(_call(call["name"], call.get("arguments", {})))
    if not calls and choice == "required":  # cut short by max_tokens: what there is, as the one call's text
        return [_call(tools[0].function.name, text)] if len(tools) == 1 else None
    return calls or None
