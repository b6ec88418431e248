"""langchain-openai's standard flows: bind_tools with a forced tool (strict, and LangChain's default
non-strict schema), with_structured_output by json_schema and by function_calling, and
OpenAIEmbeddings (at its defaults, and with check_embedding_ctx_length off), each embedding
compared with the openai SDK's embedding of the same string."""

from __future__ import annotations

import math
from typing import Literal

import openai
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel

from _flow import BASE_URL, EMBEDDING_MODEL, MODEL, TOKEN, check, run

TEXT = "the cat"


def chat(max_tokens: int = 24) -> ChatOpenAI:
    return ChatOpenAI(base_url=BASE_URL, api_key=TOKEN, model=MODEL, temperature=0, max_tokens=max_tokens,
                      max_retries=0, timeout=120)


@tool
def get_weather(city: Literal["Paris"]) -> str:
    """The weather in a city."""
    return "18 degrees and sunny"


class Capital(BaseModel):
    city: Literal["Paris", "Rome"]


def _forced_call(**options) -> dict:
    message = chat().bind_tools([get_weather], tool_choice="get_weather", **options).invoke(
        "What is the weather in Paris?")
    return {"tool_calls": [{"name": c["name"], "args": c["args"]} for c in message.tool_calls],
            "invalid_tool_calls": len(message.invalid_tool_calls),
            "finish_reason": message.response_metadata.get("finish_reason")}


@check
def bind_tools_strict() -> dict:
    return _forced_call(strict=True)


@check
def bind_tools_default() -> dict:
    """LangChain's default: the schema leaves additionalProperties unsaid (issue 25, item 5)."""
    return _forced_call()


@check
def structured_output_json_schema() -> dict:
    answer = chat().with_structured_output(Capital, method="json_schema").invoke("The capital of France?")
    return {"type": type(answer).__name__, "city": answer.city}


@check
def structured_output_function_calling() -> dict:
    answer = chat().with_structured_output(Capital, method="function_calling").invoke("The capital of France?")
    return {"type": type(answer).__name__, "city": getattr(answer, "city", None)}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _the_text_embedded_by_the_sdk() -> list[float]:
    with openai.OpenAI(base_url=BASE_URL, api_key=TOKEN, max_retries=0) as sdk:
        return sdk.embeddings.create(model=EMBEDDING_MODEL, input=TEXT).data[0].embedding


def _embeddings(**options) -> dict:
    embeddings = OpenAIEmbeddings(base_url=BASE_URL, api_key=TOKEN, model=EMBEDDING_MODEL, max_retries=0,
                                  **options)
    vector = embeddings.embed_query(TEXT)
    return {"dimensions": len(vector), "cosine_to_the_text": round(_cosine(vector, _the_text_embedded_by_the_sdk()), 6)}


@check
def embeddings_defaults() -> dict:
    """check_embedding_ctx_length=True (the default) sends cl100k token ids (issue 25, item 3)."""
    return _embeddings()


@check
def embeddings_text() -> dict:
    return _embeddings(check_embedding_ctx_length=False)


if __name__ == "__main__":
    run()
