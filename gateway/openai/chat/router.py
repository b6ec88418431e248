from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.deps import GatewayDep, PrincipalDep
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.service import create_chat_completion
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES, summary="Create a chat completion")
async def chat_completions(body: ChatCompletionRequest, principal: PrincipalDep, gateway: GatewayDep,
                           request: Request) -> Response:
    return await create_chat_completion(gateway, principal, body, request)
