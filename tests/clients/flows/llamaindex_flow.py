"""llama-index's OpenAILike (its way to any OpenAI-compatible server): chat, streamed chat, a plain
completion, a required tool call, and structured prediction into a pydantic model."""

# No `from __future__ import annotations`: FunctionTool reads the function's annotations as objects.

from typing import Literal

from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel

from _flow import BASE_URL, CONTEXT_TOKENS, MODEL, TOKEN, check, run


def llm(**options) -> OpenAILike:
    return OpenAILike(model=MODEL, api_base=BASE_URL, api_key=TOKEN, context_window=CONTEXT_TOKENS,
                      temperature=0, max_retries=0, timeout=120,
                      **({"is_chat_model": True, "is_function_calling_model": True, "max_tokens": 8} | options))


HELLO = [ChatMessage(role="user", content="Say hello.")]


def get_weather(city: Literal["Paris"]) -> str:
    """The weather in a city."""
    return "18 degrees and sunny"


class Capital(BaseModel):
    city: Literal["Paris", "Rome"]


@check
def chat() -> dict:
    response = llm().chat(HELLO)
    return {"role": str(response.message.role.value), "content_is_text": isinstance(response.message.content, str)}


@check
def stream_chat() -> dict:
    deltas = [r.delta for r in llm().stream_chat(HELLO)]
    return {"deltas": len(deltas), "text_is_empty": "".join(d or "" for d in deltas) == ""}


@check
def complete() -> dict:
    response = llm(is_chat_model=False).complete("The capital of France is")
    return {"text_is_empty": response.text == ""}


@check
def required_tool_call() -> dict:
    model = llm(max_tokens=24)
    response = model.chat_with_tools([FunctionTool.from_defaults(fn=get_weather)],
                                     user_msg="What is the weather in Paris?", tool_required=True)
    calls = model.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    return {"calls": [{"name": c.tool_name, "kwargs": c.tool_kwargs} for c in calls]}


@check
def structured_predict() -> dict:
    answer = llm(max_tokens=24).structured_predict(Capital, PromptTemplate("The capital of {country}?"),
                                                   country="France")
    return {"type": type(answer).__name__, "city": answer.city}


if __name__ == "__main__":
    run()
