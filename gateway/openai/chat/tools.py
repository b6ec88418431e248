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
from typing import Annotated, Literal

from pydantic import Field, model_validator

from engine import random_hex
from gateway.openai.closed_schemas import check_strict, closed
from gateway.openai.protocol import JsonObject, RequestModel

MAX_TOOLS = 128
MARKER = "<tool_call>"
CLOSING = "</tool_call>"
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
    def _strict(self) -> FunctionDefinition:
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


def constrained_schema(tools: list[Tool], choice: ToolChoice | None, parallel: bool = True) -> str | None:
    """The JSON schema the answer must match: a named function's arguments, or for `required` calls of
    any function as {"name", "arguments"} objects, an array of one or more (one object alone when
    parallel tool calls are off); None for `auto` and `none` (free text)."""
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        return json.dumps(parameters(tool), ensure_ascii=False, separators=(",", ":"))
    if choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": t.function.name}, "arguments": parameters(t)},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
        one = {"anyOf": calls} if len(calls) > 1 else calls[0]
        schema = {"type": "array", "items": one, "minItems": 1} if parallel else one
        return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    return None


def new_call_id() -> str:
    return "call_" + random_hex(12)  # 96 random bits, from the engine's block of OS randomness (no system call)


def _call(name: str, arguments: object) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": text}}


def _named_call(candidate: object, names: set[str]) -> dict | None:
    """A {"name", "arguments"} object naming one of the tools, as a call; None otherwise."""
    if (isinstance(candidate, dict) and candidate.get("name") in names
            and isinstance(candidate.get("arguments", {}), dict)):
        return _call(candidate["name"], candidate.get("arguments", {}))
    return None


def _partial_marker(text: str) -> int:
    """How many of text's last characters could begin a <tool_call> marker."""
    for size in range(min(len(MARKER) - 1, len(text)), 0, -1):
        if MARKER.startswith(text[-size:]):
            return size
    return 0


class AutoCalls:
    """Reads an `auto` answer as it is generated: content until the first <tool_call> marker, then
    each tagged call as its tag closes. feed() gives what may be sent now: content (never a piece
    that may begin a marker, nor trailing whitespace, which a call would drop) and the calls just
    closed; finish() gives the rest. Once a call is made the content ends at the first marker (as
    vLLM's tool parsers do); with no call every character is content. parallel=False keeps the
    first call only. The whole-answer path reads through the same class, so both agree."""

    def __init__(self, tools: list[Tool], parallel: bool = True) -> None:
        self._names = {t.function.name for t in tools}
        self._parallel = parallel
        self.text = ""
        self.calls: list[dict] = []
        self._sent = 0  # characters of text sent as content
        self._scanned: int | None = None  # where the next tag may start, once the first marker is seen
        self._unclosed = 0  # where a closing tag not yet seen may start

    def feed(self, new_text: str) -> tuple[str, list[dict]]:
        # Each search starts where the last one stopped, so an answer costs time in its length, not
        # its length squared (a long call's arguments, token by token, on the event loop).
        self.text += new_text
        content = ""
        if self._scanned is None:
            start = self.text.find(MARKER, self._sent)  # what was sent held no piece of a marker
            end = len(self.text) - _partial_marker(self.text) if start < 0 else start
            stop = self._sent + len(self.text[self._sent:end].rstrip())
            if stop > self._sent:
                content, self._sent = self.text[self._sent:stop], stop
            if start < 0:
                return content, []
            self._scanned = self._unclosed = start
        made = []
        closed = self.text.find(CLOSING, self._unclosed) >= 0
        while closed and (tag := TOOL_CALL.search(self.text, self._scanned)) is not None:
            self._scanned = tag.end()
            try:
                call = _named_call(json.loads(tag.group(1)), self._names)
            except ValueError:
                call = None
            if call is not None and (self._parallel or not self.calls):
                self.calls.append(call)
                made.append(call)
        # No complete tag is left: the next one closes in text still to come.
        self._unclosed = max(self._scanned, len(self.text) - len(CLOSING) + 1)
        return content, made

    def finish(self) -> str:
        """The content still held at the end: none once a call was made, else the rest of the text."""
        if self.calls:
            return ""
        rest, self._sent = self.text[self._sent:], len(self.text)
        return rest


def parse_calls(text: str, tools: list[Tool], choice: ToolChoice | None,
                parallel: bool = True) -> tuple[list[dict] | None, str | None]:
    """The tool calls in an answer, as OpenAI's message.tool_calls (None when it has none), and the
    message's content. A named choice's answer is the arguments themselves; `required`'s is an array
    of {"name", "arguments"} objects (one object when parallel tool calls are off); `auto`'s is text
    with <tool_call> tags, each holding one (AutoCalls)."""
    if isinstance(choice, NamedToolChoice):
        return [_call(choice.function.name, text)], None
    names = {t.function.name for t in tools}
    if choice == "required":
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        candidates = answer if isinstance(answer, list) and parallel else [answer]
        calls = [call for candidate in candidates if (call := _named_call(candidate, names)) is not None]
        if calls:
            return calls, None
        if not parallel and len(tools) == 1:  # cut short by max_tokens: what there is, as the one call's text
            return [_call(tools[0].function.name, text)], None
        return None, text
    if choice == "auto" or choice is None:
        reader = AutoCalls(tools, parallel)
        content, _ = reader.feed(text)
        if reader.calls:
            return reader.calls, content or None
    return None, text
