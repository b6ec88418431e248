"""Embeddings: count the inputs' tokens, admit them like any request, answer OpenAI's list of vectors."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi.responses import JSONResponse, Response

from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.errors import InvalidRequest
from gateway.openai.asks import estimate_tokens
from gateway.openai.embeddings import cl100k
from gateway.openai.embeddings.protocol import EmbeddingRequest
from gateway.pipeline.admission import EMBEDDINGS_ROUTE, Ask, admit, new_request_id
from gateway.pipeline.exchange import Exchange
from gateway.pipeline.run import Run


async def build_embeddings_ask(gateway: Gateway, body: EmbeddingRequest, request_id: str) -> Ask:
    """With the embedded encoder, the ids it will run (texts cut at its length, tokenized off the
    event loop) and their count, at most embedding_max_request_tokens; otherwise (an upstream, or
    a model this gateway does not embed with) the count alone: token ids as given, texts by
    estimate, settled on the upstream's own count afterwards. Token ids of a model that reads
    them as cl100k_base are decoded first (off the event loop too) and go on as their texts."""
    served = gateway.models.get(body.model)
    if served is not None and served.task != "embed":
        served = None  # admission refuses it by name; here it is counted as an upstream's would be
    texts, ids = body.texts(), body.token_ids()
    decoded = False
    if served is not None and ids is not None and served.token_ids == "cl100k_base":
        texts, ids, decoded = await asyncio.to_thread(cl100k.decode, ids, body.model), None, True
    inputs = None
    if served is not None and served.tokenize_inputs is not None:
        inputs = ids if ids is not None else await asyncio.to_thread(served.tokenize_inputs, texts or [])
        prompt_tokens = sum(map(len, inputs))
        bound = gateway.settings.embedding_max_request_tokens
        if prompt_tokens > bound:
            raise InvalidRequest(f"the inputs have {prompt_tokens} tokens together; an embeddings request "
                                 f"may have at most {bound}", param="input")
    elif ids is not None:
        prompt_tokens = sum(map(len, ids))
    else:
        prompt_tokens = sum(estimate_tokens(text) for text in texts or [])
    return Ask(route=EMBEDDINGS_ROUTE, request_id=request_id, model=body.model, stream=False,
               prompt_tokens=prompt_tokens, token_ids=[], max_tokens=None,
               body=body.model_dump(mode="json", exclude_none=True), embed_inputs=inputs,
               embed_texts=texts if decoded else None)


def encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # OpenAI's: little-endian float32 bytes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def create_embeddings(gateway: Gateway, exchange: Exchange, principal: Principal,
                            body: EmbeddingRequest) -> Response:
    ask = await build_embeddings_ask(gateway, body, new_request_id("embd"))
    run = Run(gateway, await admit(gateway, exchange, principal, ask), exchange)
    async with run:
        result = await run.embed()
        data = [{"object": "embedding", "index": index, "embedding": encoded(vector, body.encoding_format)}
                for index, vector in enumerate(result.vectors)]
        usage = {"prompt_tokens": run.prompt_tokens, "total_tokens": run.prompt_tokens}
        await run.completed()
    return JSONResponse({"object": "list", "data": data, "model": body.model, "usage": usage},
                        headers={"X-Request-Id": run.request_id})
