"""Responses: translate the request into chat's, run it exactly as chat runs (policy, budget,
engine, audit), and answer with a response object or the Responses API's stream of events.
Where the policy allows it, a response is stored (encrypted, per tenant) and may be continued: by
its tenant, or where the decision's cache scope is principal (or none), by its principal alone."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from engine import RequestOutput, random_hex
from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.deployments.base import UpstreamOutput
from gateway.errors import GatewayError, InvalidRequest, ResponseNotFound
from gateway.openai.asks import logprob_text
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.render import answer
from gateway.openai.chat.service import chat_ask
from gateway.openai.responder import Renderer, chat_logprobs, joined, json_bytes, respond, usage
from gateway.openai.responses_api.protocol import ResponsesRequest
from gateway.openai.responses_api.store import ResponseStore
from gateway.pipeline.admission import admit
from gateway.pipeline.exchange import Exchange
from gateway.pipeline.run import Run

ROUTE = "responses"
# Chat's names for fields that have other names here, for the errors chat's checks raise.
_CHAT_FIELDS = {"max_completion_tokens": ("max_output_tokens",), "response_format": ("text", "format")}


def chat_request(body: ResponsesRequest, previous: Sequence[dict] = ()) -> ChatCompletionRequest:
    """The chat request that runs this one (after the previous conversation). What chat refuses
    is refused here with chat's error, at the field of this request it came from."""
    wire, origins = body.chat_body(previous)
    try:
        return ChatCompletionRequest.model_validate(wire)
    except ValidationError as exc:
        raise RequestValidationError([error | {"loc": ("body", *_origin(error["loc"], origins))}
                                      for error in exc.errors()]) from None


def _origin(loc: tuple, origins: list[tuple]) -> tuple:
    if len(loc) >= 2 and loc[0] == "messages" and isinstance(loc[1], int):
        return origins[loc[1]] + tuple(loc[2:])
    if len(loc) >= 3 and loc[0] == "tools" and loc[2] == "function":  # chat nests what is flat here
        return tuple(loc[:2]) + tuple(loc[3:])
    if loc and loc[0] in _CHAT_FIELDS:
        return _CHAT_FIELDS[loc[0]] + tuple(loc[1:])
    return tuple(loc)


def _whole_calls(pieces: list[dict]) -> list[dict]:
    """An upstream's tool calls as whole calls: streamed pieces (with an index) joined, whole ones as they are."""
    calls: dict[object, dict] = {}
    for piece in pieces:
        call = calls.setdefault(piece.get("index", len(calls)),
                                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = piece.get("id") or call["id"]
        function = piece.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""
    return list(calls.values())


def answer_of(chat: ChatCompletionRequest, outputs: list[RequestOutput]) -> tuple[str, list[dict]]:
    """The answer's text and its function calls (as chat's message.tool_calls): read from the text
    as chat reads it, or the upstream's own calls."""
    text, _ = joined(outputs)
    if not chat.active_tools:
        return text, []
    if any(isinstance(o, UpstreamOutput) for o in outputs):
        return text, _whole_calls([c for o in outputs if isinstance(o, UpstreamOutput) for c in o.tool_calls])
    message, _ = answer(chat, text, outputs[-1].finish_reason if outputs else None)
    return message["content"] or "", message["tool_calls"] or []


def assistant_message(text: str, calls: list[dict]) -> dict:
    """The answer as the chat message a stored conversation keeps."""
    if calls:
        return {"role": "assistant", "content": text or None, "tool_calls": calls}
    return {"role": "assistant", "content": text}


def response_usage(run: Run) -> dict:
    counts = usage(run)  # chat's figures, with its rule for cached tokens in the shared scope
    return {"input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}


class StoredResponses:
    """Where a response and its conversation are kept, when they are: under the caller's tenant,
    and its principal where the decision scopes them so."""

    def __init__(self, store: ResponseStore, gateway: Gateway, principal: Principal, decision,
                 previous: list[dict], conversation: list[dict]) -> None:
        self.store = store
        self.digests = gateway.audit.principal_digests(principal)
        self.decision = decision
        self.previous = previous + conversation  # the conversation up to this answer

    async def put(self, response_id: str, response: dict, text: str, calls: list[dict]) -> None:
        record = {"response": response, "conversation": self.previous + [assistant_message(text, calls)]}
        if _principal_owned(self.decision):
            record["principal"] = self.digests["principal"]  # sealed with the rest: it cannot be edited out
        await self.store.put(self.digests["tenant"], response_id, record,
                             ttl_s=self.decision.responses.retention_days * 86400)

    async def delete(self, response_id: str) -> None:
        await self.store.delete(self.digests["tenant"], response_id)


class ResponseRenderer(Renderer):
    """The response object and its output items as they stand at each point of a run: one body, or
    the Responses API's events in its order, numbered from 0. With tools the answer is read whole (a
    call or text, as chat's auto and required are): its items' events all come at the end."""

    def __init__(self, run: Run, body: ResponsesRequest, chat: ChatCompletionRequest, *,
                 store: StoredResponses | None, token_text=None) -> None:
        super().__init__(run)
        self.body = body
        self.chat = chat
        self.store = store  # None: not stored
        self.token_text = token_text  # with include's logprobs: the model's token text, for each entry
        self.id = run.request_id
        self.message_id = "msg_" + self.id.removeprefix("resp_")
        self.tools = bool(chat.active_tools)
        self.held: list[RequestOutput] = []  # a stream's outputs; with tools, nothing is sent until the last
        self.answered: tuple[str, list[dict], list[dict]] | None = None  # text, calls, output items
        self._sequence = itertools.count()
        self._at = {"item_id": self.message_id, "output_index": 0, "content_index": 0}

    @property
    def stored(self) -> bool:
        return self.store is not None

    @property
    def incomplete(self) -> bool:
        return self.run.finish_reason == "length"  # max_output_tokens, or the policy's cap on it

    def logprobs(self, outputs: list[RequestOutput]) -> list[dict]:
        """The output text's logprobs, chat's entries, when `include` asks for them; else none."""
        if self.token_text is None:
            return []
        return chat_logprobs(self.token_text, [lp for o in outputs for lp in o.logprobs])

    def part(self, text: str, logprobs: list[dict] | None = None) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    @property
    def status(self) -> str:
        return "incomplete" if self.incomplete else "completed"

    def message(self, text: str | None, logprobs: list[dict] | None = None) -> dict:
        """The output message; text None: still being written."""
        return {"id": self.message_id, "type": "message", "status": "in_progress" if text is None else self.status,
                "role": "assistant", "content": [] if text is None else [self.part(text, logprobs)]}

    def output(self, text: str, calls: list[dict], outputs: Sequence[RequestOutput] = ()) -> list[dict]:
        """The output items: the message (unless the answer is calls alone), then one function_call per call."""
        return ([self.message(text, self.logprobs(list(outputs)))] if text or not calls else []) + [
            {"id": "fc_" + random_hex(), "type": "function_call", "status": self.status, "call_id": call["id"],
             "name": call["function"]["name"], "arguments": call["function"]["arguments"]} for call in calls]

    def response(self, output: list[dict] | None) -> dict:
        """The response object; output None: in progress, with no output yet."""
        body, done = self.body, output is not None
        status = self.status if done else "in_progress"
        return {
            "id": self.id, "object": "response", "created_at": self.run.admitted.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": body.model,
            "output": output if done else [],
            "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id, "store": self.stored,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": (body.text.format if body.text and body.text.format else None) or {"type": "text"}},
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "tools": [tool.model_dump() for tool in body.tools or []],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "top_logprobs": body.top_logprobs or 0,
            "truncation": "disabled", "usage": response_usage(self.run) if done else None,
            "user": body.user, "metadata": body.metadata or {},
        }

    def _answer(self, outputs: list[RequestOutput]) -> list[dict]:
        text, calls = answer_of(self.chat, outputs)
        self.answered = text, calls, self.output(text, calls, outputs)
        return self.answered[2]

    def _answered(self) -> tuple[str, list[dict], list[dict]]:
        """The answer whole() or closing() read (text, calls, output items)."""
        if self.answered is None:
            raise RuntimeError("the answer is read by whole() or closing() first")
        return self.answered

    def whole(self, outputs: list[RequestOutput]) -> dict:
        return self.response(self._answer(outputs))

    async def keep(self) -> None:
        if self.store is not None:
            text, calls, output = self._answered()
            await self.store.put(self.id, self.response(output), text, calls)

    async def forget(self) -> None:
        if self.store is not None:
            await self.store.delete(self.id)

    # -- the stream's events --

    def encode(self, event: dict) -> bytes:
        return stream_event(event | {"sequence_number": next(self._sequence)})

    def _message_opening(self) -> list[dict]:
        return [{"type": "response.output_item.added", "output_index": 0, "item": self.message(None)},
                {"type": "response.content_part.added", **self._at, "part": self.part("")}]

    def _text_delta(self, text: str, logprobs: list[dict] | None = None) -> list[dict]:
        if not text:
            return []
        return [{"type": "response.output_text.delta", **self._at, "delta": text, "logprobs": logprobs or []}]

    def opening(self) -> list[dict]:
        return [{"type": "response.created", "response": self.response(None)},
                {"type": "response.in_progress", "response": self.response(None)},
                *([] if self.tools else self._message_opening())]

    def delta(self, output: RequestOutput) -> list[dict]:
        self.held.append(output)
        return [] if self.tools else self._text_delta(output.new_text, self.logprobs([output]))

    def _item_events(self, index: int, item: dict) -> list[dict]:
        at, tools = self._at, self.tools
        if item["type"] == "message":
            text, logprobs = item["content"][0]["text"], item["content"][0]["logprobs"]
            return [*(self._message_opening() if tools else []), *(self._text_delta(text, logprobs) if tools else []),
                    {"type": "response.output_text.done", **at, "text": text, "logprobs": logprobs},
                    {"type": "response.content_part.done", **at, "part": item["content"][0]},
                    {"type": "response.output_item.done", "output_index": 0, "item": item}]
        call = {"item_id": item["id"], "output_index": index}
        return [{"type": "response.output_item.added", "output_index": index,
                 "item": item | {"arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", **call, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **call, "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": item}]

    def closing(self) -> list[dict]:
        return [event for index, item in enumerate(self._answer(self.held)) for event in self._item_events(index, item)]

    def done(self) -> bytes:
        kind = "response.incomplete" if self.incomplete else "response.completed"
        return self.encode({"type": kind, "response": self.response(self._answered()[2])})

    def error(self, error: GatewayError) -> dict:
        return {"type": "error", "code": error.code, "message": error.message, "param": error.param}


def stream_event(payload: dict) -> bytes:
    return f"event: {payload['type']}\ndata: ".encode() + json_bytes(payload) + b"\n\n"


def _stored_param(body: ResponsesRequest) -> str | None:
    """The field that asks for the store, if any."""
    if body.previous_response_id is not None:
        return "previous_response_id"
    return "store" if body.store else None


# Cache scopes whose stored responses belong to the principal that made them, not to its whole
# tenant: the decision keeps a principal's prompts from its colleagues' caches, so its stored
# conversations too ("none": restricted data, the narrowest owner).
_PRINCIPAL_SCOPES = ("principal", "none")


def _principal_owned(decision) -> bool:
    """Whether a response stored under this decision is its principal's alone (else its tenant's)."""
    return decision.cache.scope in _PRINCIPAL_SCOPES


async def _stored(gateway: Gateway, principal: Principal, response_id: str) -> dict | None:
    """The record stored under this id for this caller: its tenant's, and if it was stored for
    one principal, only that principal's. Anyone else is told it does not exist."""
    if gateway.responses_store is None:
        return None
    digests = gateway.audit.principal_digests(principal)
    record = await gateway.responses_store.get(digests["tenant"], response_id)
    if record is None or record.get("principal", digests["principal"]) != digests["principal"]:
        return None
    return record


async def _previous_conversation(gateway: Gateway, principal: Principal, body: ResponsesRequest) -> list[dict]:
    if body.previous_response_id is None:
        return []
    record = await _stored(gateway, principal, body.previous_response_id)
    if record is None:
        raise ResponseNotFound(param="previous_response_id", code="previous_response_not_found")
    return record["conversation"]


async def create_response(gateway: Gateway, exchange: Exchange, principal: Principal,
                          body: ResponsesRequest) -> Response:
    asked = _stored_param(body)
    if asked is not None and gateway.responses_store is None:
        raise InvalidRequest("responses are not stored here: this gateway has no response store", param=asked)
    previous = await _previous_conversation(gateway, principal, body)  # before admission: its tokens count
    chat = chat_request(body, previous)
    ask = chat_ask(gateway, chat, "resp_" + random_hex(), route=ROUTE, format_param="text.format")
    run = Run(gateway, await admit(gateway, exchange, principal, ask), exchange)
    decision = run.admitted.judgement.decision
    async with run:
        if asked is not None and not decision.responses.store:
            raise InvalidRequest("this tenant's policy does not allow stored responses (for this data "
                                 "classification); send the conversation as input items", param=asked)
    store = None
    if body.store and decision.responses.store and gateway.responses_store is not None:  # else refused above
        store = StoredResponses(gateway.responses_store, gateway, principal, decision, previous, body.conversation())
    token_text = logprob_text(gateway, body.model) if chat.logprobs else None
    return await respond(run, ResponseRenderer(run, body, chat, store=store, token_text=token_text),
                         stream=body.stream)


async def retrieve_response(gateway: Gateway, principal: Principal, response_id: str) -> Response:
    """A stored response, to its own tenant only (its own principal only, where the decision scoped it so)."""
    record = None
    if gateway.responses_store is not None:
        record = await _stored(gateway, principal, response_id)
    if record is None:
        raise ResponseNotFound()
    return JSONResponse(record["response"])
