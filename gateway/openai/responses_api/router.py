from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.deps import Call, CallDep, inference_caller
from gateway.openai.openapi import ERROR_RESPONSES
from gateway.openai.responses_api.protocol import ResponsesRequest
from gateway.openai.responses_api.service import ROUTE, create_response, retrieve_response

router = APIRouter()
Caller = Annotated[Call, Depends(inference_caller(ROUTE))]


@router.post("/v1/responses", responses=ERROR_RESPONSES, summary="Create a model response")
async def responses(body: ResponsesRequest, call: Caller) -> Response:
    return await create_response(call.gateway, call.exchange, call.principal, body)


@router.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES, summary="Retrieve a stored response")
async def retrieve(response_id: str, call: CallDep) -> Response:
    return await retrieve_response(call.gateway, call.principal, response_id)
