from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.deps import GatewayDep, PrincipalDep
from gateway.openai.embeddings.protocol import EmbeddingRequest
from gateway.openai.embeddings.service import create_embeddings
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/embeddings", responses=ERROR_RESPONSES, summary="Create embeddings")
async def embeddings(body: EmbeddingRequest, principal: PrincipalDep, gateway: GatewayDep,
                     request: Request) -> Response:
    return await create_embeddings(gateway, principal, body, request)
