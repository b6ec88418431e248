"""Wire models shared by the OpenAI endpoints. Request models forbid unknown fields."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from engine import MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_TOKENS, MAX_PENALTY
from gateway.json_values import json_depth, json_strings

MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256

# JSON's \ud800-\udfff escapes decode to lone surrogates: code points, but not Unicode scalar
# values, which no encoder, tokenizer or log handler can write.
_SURROGATE = re.compile("[\ud800-\udfff]")


# Objects and arrays in one free-form field (a schema, tool parameters): far above any schema a
# policy admits (max_schema_depth is 16 unless a tenant's data sets it), far below what the
# validators and serializers after this one can walk (pydantic's serializer gives up at a few
# hundred levels, json.dumps at Python's recursion limit).
MAX_FIELD_DEPTH = 64


def _within_depth(value: object) -> object:
    # Runs before any validator or serializer walks the value, each of which could recurse.
    if json_depth(value) > MAX_FIELD_DEPTH:
        raise ValueError(f"nests more than {MAX_FIELD_DEPTH} levels of objects and arrays")
    return value


# The request fields that hold JSON of the caller's shape; the typed ones nest as their models do.
JsonObject = Annotated[dict, BeforeValidator(_within_depth)]
JsonObjects = Annotated[list[dict], BeforeValidator(_within_depth)]


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _unicode_text(cls, value: object) -> object:
        # Every string of a request, at any depth, before it reaches a tokenizer, a log or an error;
        # nested request models checked their own fields.
        if any(_SURROGATE.search(text) for text in json_strings(value)):
            raise ValueError("must be valid Unicode text, without lone surrogates (\\ud800-\\udfff)")
        return value


class StreamOptions(RequestModel):
    include_usage: bool = False
    include_obfuscation: bool = False  # accepted for SDK compatibility; nothing is obfuscated


class SamplingFields(RequestModel):
    """Fields both completion endpoints accept, with OpenAI's ranges."""

    model: Annotated[str, Field(min_length=1, max_length=256)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: int | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    presence_penalty: Annotated[float, Field(ge=-MAX_PENALTY, le=MAX_PENALTY)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-MAX_PENALTY, le=MAX_PENALTY)] | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]],
                          Field(max_length=MAX_LOGIT_BIAS_TOKENS)] | None = None
    # Extensions, with vLLM's names and ranges (-1 or 0 turns top_k off); docs/engine.md, Sampling.
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop sequence must have 1 to {MAX_STOP_CHARS} characters")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and not all(key.isascii() and key.isdigit() and len(key) <= 10 for key in value):
            raise ValueError("keys must be token ids, as decimal strings")
        return value

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tenantgate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
