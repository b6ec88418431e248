from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.deps import GatewayDep, PrincipalDep
from gateway.openai.completions.protocol import CompletionRequest
from gateway.openai.completions.service import create_completion
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/completions", responses=ERROR_RESPONSES, summary="Create a text completion")
async def completions(body: CompletionRequest, principal: PrincipalDep, gateway: GatewayDep,
                      request: Request) -> Response:
    return await create_completion(gateway, principal, body, request)
