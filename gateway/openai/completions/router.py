from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.deps import Call, inference_caller
from gateway.openai.completions.protocol import CompletionRequest
from gateway.openai.completions.service import ROUTE, create_completion
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()
Caller = Annotated[Call, Depends(inference_caller(ROUTE))]


@router.post("/v1/completions", responses=ERROR_RESPONSES, summary="Create a text completion")
async def completions(body: CompletionRequest, call: Caller) -> Response:
    return await create_completion(call.gateway, call.exchange, call.principal, body)
