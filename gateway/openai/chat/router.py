from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.deps import GatewayDep, inference_caller
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.service import ROUTE, create_chat_completion
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()
Caller = inference_caller(ROUTE)


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES, summary="Create a chat completion")
async def chat_completions(body: ChatCompletionRequest, principal: Caller, gateway: GatewayDep,
                           request: Request) -> Response:
    return await create_chat_completion(gateway, principal, body, request)
