"""instructor's three OpenAI modes: JSON_SCHEMA (response_format json_schema), TOOLS (a forced tool
call on chat completions) and RESPONSES_TOOLS (a forced function call on the Responses API, with
text.format json_schema beside it). The model's schema is an enum of two values."""

from __future__ import annotations

from typing import Literal

import instructor
import openai
from pydantic import BaseModel

from _flow import BASE_URL, MODEL, TOKEN, check, run


class Capital(BaseModel):
    city: Literal["Paris", "Rome"]


def _extract(mode: instructor.Mode) -> dict:
    client = instructor.from_openai(openai.OpenAI(base_url=BASE_URL, api_key=TOKEN, max_retries=0, timeout=120),
                                    mode=mode)
    answer = client.create(model=MODEL, response_model=Capital, max_retries=1, temperature=0, max_tokens=24,
                           messages=[{"role": "user", "content": "The capital of France?"}])
    return {"type": type(answer).__name__, "city": answer.city}


@check
def json_schema() -> dict:
    return _extract(instructor.Mode.JSON_SCHEMA)


@check
def tools() -> dict:
    return _extract(instructor.Mode.TOOLS)


@check
def responses_tools() -> dict:
    return _extract(instructor.Mode.RESPONSES_TOOLS)


if __name__ == "__main__":
    run()
