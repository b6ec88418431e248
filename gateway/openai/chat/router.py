from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.deps import Call, inference_caller
from gateway.openai.chat.protocol import ChatCompletionRequest
from gateway.openai.chat.service import ROUTE, create_chat_completion
from gateway.openai.openapi import ERROR_RESPONSES

router = APIRouter()
Caller = Annotated[Call, Depends(inference_caller(ROUTE))]


@router.post("/v1/chat/completions", responses=ERROR_RESPONSES, summary="Create a chat completion")
async def chat_completions(body: ChatCompletionRequest, call: Caller) -> Response:
    return await create_chat_completion(call.gateway, call.exchange, call.principal, body)
