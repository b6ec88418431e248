"""The openai SDK's documented flows: a multi-turn loop that appends the answer, a tool round trip,
parse() with pydantic, streaming with usage, the Responses API with tools and previous_response_id,
and the errors an agent must tell apart (a request that can never pass the budget)."""

from __future__ import annotations

import json
import time
from typing import Literal

import openai
from pydantic import BaseModel

from _flow import (
    BASE_URL,
    EMBEDDING_MODEL,
    MODEL,
    SMALL_BUDGET_TOKEN,
    TOKEN,
    WEATHER_PARAMETERS,
    WEATHER_TOOL,
    check,
    run,
)

client = openai.OpenAI(base_url=BASE_URL, api_key=TOKEN, max_retries=0, timeout=120)
SHORT = {"model": MODEL, "temperature": 0, "max_tokens": 8}


@check
def multi_turn_append() -> dict:
    """The docs' loop: the answer object goes back into messages as it is, then a second call."""
    messages: list = [{"role": "user", "content": "Say hello."}]
    first = client.chat.completions.create(messages=messages, **SHORT)
    messages += [first.choices[0].message, {"role": "user", "content": "Say it again."}]
    second = client.chat.completions.create(messages=messages, **SHORT)
    return {"first_refusal": first.choices[0].message.refusal, "second_finish": second.choices[0].finish_reason}


@check
def multi_turn_model_dump() -> dict:
    """The same loop with message.model_dump(), which sends every field the SDK knows (nulls too)."""
    messages: list = [{"role": "user", "content": "Say hello."}]
    first = client.chat.completions.create(messages=messages, **SHORT)
    sent = first.choices[0].message.model_dump()
    messages += [sent, {"role": "user", "content": "Say it again."}]
    second = client.chat.completions.create(messages=messages, **SHORT)
    return {"sent_keys": sorted(sent), "second_finish": second.choices[0].finish_reason}


@check
def tools_round_trip() -> dict:
    """A named tool choice (the schema allows one argument value), the call appended with its result."""
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(messages=messages, tools=[WEATHER_TOOL], max_tokens=24, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           model=MODEL)
    message = first.choices[0].message
    call = message.tool_calls[0]
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18}'}]
    second = client.chat.completions.create(messages=messages, tools=[WEATHER_TOOL], **SHORT)
    return {"name": call.function.name, "arguments": json.loads(call.function.arguments),
            "second_finish": second.choices[0].finish_reason,
            "second_content_is_text": isinstance(second.choices[0].message.content, str)}


class Capital(BaseModel):
    city: Literal["Paris", "Rome"]


@check
def parse_pydantic() -> dict:
    """parse() sends the model's strict json_schema; an enum of two values decides the answer's shape."""
    parsed = client.chat.completions.parse(model=MODEL, temperature=0, max_tokens=16, response_format=Capital,
                                           messages=[{"role": "user", "content": "The capital of France?"}])
    answer = parsed.choices[0].message.parsed
    return {"parsed_type": type(answer).__name__, "city": answer.city}


@check
def stream_with_usage() -> dict:
    """A stream with include_usage: content deltas, then one chunk with usage and no choices."""
    chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "Say hello."}], stream=True,
                                                 stream_options={"include_usage": True}, **SHORT))
    usage = chunks[-1].usage
    return {"content_chunks": sum(1 for c in chunks if c.choices and c.choices[0].delta.content),
            "last_choices": len(chunks[-1].choices), "completion_tokens": usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens,
            "finish": next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)}


RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                  "parameters": WEATHER_PARAMETERS, "strict": True}


@check
def responses_tools_previous_response_id() -> dict:
    """A forced function call in a stored response, then its output sent with previous_response_id."""
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[RESPONSES_TOOL],
                                    tool_choice={"type": "function", "name": "get_weather"}, store=True,
                                    temperature=0, max_output_tokens=24)
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model=MODEL, previous_response_id=first.id, store=True, temperature=0,
                                     max_output_tokens=8, tools=[RESPONSES_TOOL],
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": '{"temperature_c": 18}'}])
    return {"name": call.name, "arguments": json.loads(call.arguments), "second_status": second.status,
            "second_has_text": isinstance(second.output_text, str),
            "second_previous": second.previous_response_id == first.id}


def _counting_client(token: str) -> tuple[openai.OpenAI, list[float]]:
    """An SDK client at its default retries, counting the requests it sends."""
    sent: list[float] = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [lambda request: sent.append(time.monotonic())]})
    return openai.OpenAI(base_url=BASE_URL, api_key=token, timeout=120, http_client=http), sent


@check
def never_admissible_is_not_retried() -> dict:
    """max_tokens above the caller's whole per-minute budget: a 429 the SDK must not wait out."""
    sdk, sent = _counting_client(SMALL_BUDGET_TOKEN)
    started = time.monotonic()
    try:
        sdk.chat.completions.create(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "Hi."}])
    except openai.RateLimitError as exc:
        return {"status": exc.status_code, "attempts": len(sent), "seconds": round(time.monotonic() - started, 2),
                "message": exc.message, "type": exc.body.get("type"), "code": exc.code,
                "should_retry": exc.response.headers.get("x-should-retry")}
    raise AssertionError("the request was admitted")


@check
def embeddings_over_budget() -> dict:
    """An embeddings input over the caller's whole budget: what the 429 tells the caller to change."""
    sdk = openai.OpenAI(base_url=BASE_URL, api_key=SMALL_BUDGET_TOKEN, max_retries=0, timeout=120)
    try:
        sdk.embeddings.create(model=EMBEDDING_MODEL, input=["a sentence of several words to embed"] * 40)
    except openai.RateLimitError as exc:
        return {"status": exc.status_code, "message": exc.message, "type": exc.body.get("type"),
                "should_retry": exc.response.headers.get("x-should-retry")}
    raise AssertionError("the request was admitted")


@check
def error_types() -> dict:
    """The error type of each refusal an agent meets first, as the SDK hands it over."""
    types = {}
    bad = openai.OpenAI(base_url=BASE_URL, api_key="not-a-token", max_retries=0, timeout=60)
    for name, call in {
        "400": lambda: client.chat.completions.create(model=MODEL, messages=[], max_tokens=1),
        "401": lambda: bad.models.list(),
        "404": lambda: client.chat.completions.create(model="no-such-model", max_tokens=1,
                                                      messages=[{"role": "user", "content": "Hi."}]),
        "429": lambda: openai.OpenAI(base_url=BASE_URL, api_key=SMALL_BUDGET_TOKEN, max_retries=0).chat.completions
        .create(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "Hi."}]),
    }.items():
        try:
            call()
        except openai.APIStatusError as exc:
            types[name] = {"status": exc.status_code, "type": (exc.body or {}).get("type"), "code": exc.code}
    bad.close()
    return types


if __name__ == "__main__":
    run()
