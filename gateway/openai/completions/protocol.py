"""POST /v1/completions: the legacy completions body, one prompt per request."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gateway.openai.protocol import SamplingFields

MAX_PROMPT_CHARS = 1 << 20


class CompletionRequest(SamplingFields):
    prompt: (Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
             | Annotated[list[str], Field(min_length=1, max_length=1)]
             | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
             | Annotated[list[list[Annotated[int, Field(ge=0)]]], Field(min_length=1, max_length=1)])
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of must be 1")
        return self

    def prompt_value(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        return prompt  # type: ignore[return-value]  # a batch's first prompt is str or list[int]
