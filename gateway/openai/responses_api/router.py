from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.deps import GatewayDep, PrincipalDep
from gateway.openai.responses_api.protocol import ResponsesRequest
from gateway.openai.responses_api.service import create_response, retrieve_response
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/responses", responses=ERROR_RESPONSES, summary="Create a model response")
async def responses(body: ResponsesRequest, principal: PrincipalDep, gateway: GatewayDep,
                    request: Request) -> Response:
    return await create_response(gateway, principal, body, request)


@router.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES, summary="Retrieve a stored response")
async def retrieve(response_id: str, principal: PrincipalDep, gateway: GatewayDep) -> Response:
    return await retrieve_response(gateway, principal, response_id)
