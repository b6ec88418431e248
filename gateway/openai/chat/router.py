from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.auth.principal import Principal
from gateway.deps import ExchangeDep, GatewayDep, inference_caller
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.service import ROUTE, create_chat_completion
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()
Caller = Annotated[Principal, Depends(inference_caller(ROUTE))]


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES, summary="Create a chat completion")
async def chat_completions(body: ChatCompletionRequest, principal: Caller, gateway: GatewayDep,
                           exchange: ExchangeDep) -> Response:
    return await create_chat_completion(gateway, exchange, principal, body)
