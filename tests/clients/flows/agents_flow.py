"""The OpenAI Agents SDK: an agent with one function tool, forced to call it, run on both of the
SDK's models (chat completions, and its default, the Responses API); then the run's items go back
as the next run's input with a text answer asked for. Every request the SDK sends is captured, so
the report says what it sends (`include`, `store`) with and without ModelSettings.store."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from pydantic import BaseModel

from _flow import BASE_URL, MODEL, TOKEN, check, run

set_tracing_disabled(True)
calls: list[str] = []


class Reply(BaseModel):
    word: Literal["thanks"]


@function_tool
def get_weather(city: Literal["Paris"]) -> str:
    """The weather in a city."""
    calls.append(city)
    return "18 degrees and sunny"


def _client(sent: list[dict]) -> AsyncOpenAI:
    async def record(request) -> None:
        if request.method == "POST":
            sent.append({"path": request.url.path, "body": json.loads(request.content)})

    return AsyncOpenAI(base_url=BASE_URL, api_key=TOKEN, max_retries=0, timeout=120,
                       http_client=DefaultAsyncHttpxClient(event_hooks={"request": [record]}))


async def _round_trip(model_class, settings: dict) -> dict:
    sent: list[dict] = []
    calls.clear()
    model = model_class(model=MODEL, openai_client=_client(sent))
    forced = Agent(name="weather", instructions="Answer questions about the weather.", tools=[get_weather],
                   model=model, tool_use_behavior="stop_on_first_tool",
                   model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=24, **settings))
    first = await Runner.run(forced, "What is the weather in Paris?", max_turns=2)
    # The run's items (the call and its output) go back to the model, which now answers with an
    # output type whose schema allows one answer, so the answer ends by itself (the SDK takes a
    # max_output_tokens cut for an error).
    answering = forced.clone(tools=[], tool_use_behavior="run_llm_again", output_type=Reply,
                             model_settings=ModelSettings(temperature=0, max_tokens=24, **settings))
    second = await Runner.run(answering, first.to_input_list() + [{"role": "user", "content": "Thanks."}],
                              max_turns=1)
    return {"tool_ran_with": list(calls), "first_output": first.final_output,
            "second_output": second.final_output.model_dump(),
            "sent": [{"path": s["path"], "keys": sorted(s["body"]), "include": s["body"].get("include"),
                      "store": s["body"].get("store", "absent"),
                      "input_types": sorted({item.get("type", "message") for item in s["body"].get("input", [])
                                             if isinstance(item, dict)}) if isinstance(s["body"].get("input"), list)
                      else None} for s in sent]}


@check
def chat_completions_model() -> dict:
    return asyncio.run(_round_trip(OpenAIChatCompletionsModel, {}))


@check
def responses_model() -> dict:
    return asyncio.run(_round_trip(OpenAIResponsesModel, {}))


@check
def responses_model_store_false() -> dict:
    return asyncio.run(_round_trip(OpenAIResponsesModel, {"store": False}))


@check
def responses_model_store_true() -> dict:
    return asyncio.run(_round_trip(OpenAIResponsesModel, {"store": True}))


if __name__ == "__main__":
    run()
