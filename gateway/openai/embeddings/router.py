from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.deps import Call, inference_caller
from gateway.openai.embeddings.protocol import EmbeddingRequest
from gateway.openai.embeddings.service import create_embeddings
from gateway.openai.openapi import ERROR_RESPONSES
from gateway.pipeline.admission import EMBEDDINGS_ROUTE as ROUTE

router = APIRouter()
Caller = Annotated[Call, Depends(inference_caller(ROUTE))]


@router.post("/v1/embeddings", responses=ERROR_RESPONSES, summary="Create embeddings")
async def embeddings(body: EmbeddingRequest, call: Caller) -> Response:
    return await create_embeddings(call.gateway, call.exchange, call.principal, body)
