"""GET /v1/models: only the models the caller's tenant may use, as policy says."""

from fastapi import APIRouter, Request

from gateway.auth.principal import Principal
from gateway.deps import Gateway, GatewayDep, PrincipalDep
from gateway.errors import ModelNotFound, PolicyDenied
from gateway.openai.protocol import Model, ModelList
from gateway.openai.openapi import ERROR_RESPONSES
from gateway.pipeline.admission import judge, policy_input

router = APIRouter()


async def _allowed(gateway: Gateway, principal: Principal, request: Request, model: str) -> bool:
    # The same question a one-token completion would ask, so the list never promises a model
    # that a request for it would be refused.
    document = policy_input(gateway, principal, request, route="models.list", model=model, stream=False,
                            prompt_tokens=1, max_tokens=1, temperature=None)
    try:
        await judge(gateway, request, document)
    except PolicyDenied:
        return False
    return True


@router.get("/v1/models", responses=ERROR_RESPONSES, summary="List the models this caller may use")
async def list_models(principal: PrincipalDep, gateway: GatewayDep, request: Request) -> ModelList:
    models = [name for name in gateway.models if await _allowed(gateway, principal, request, name)]
    return ModelList(data=[Model(id=m, created=gateway.extras.get("started", 0)) for m in models])


@router.get("/v1/models/{model}", responses=ERROR_RESPONSES, summary="Describe one model")
async def retrieve_model(model: str, principal: PrincipalDep, gateway: GatewayDep, request: Request) -> Model:
    if model not in gateway.models or not await _allowed(gateway, principal, request, model):
        raise ModelNotFound()
    return Model(id=model, created=gateway.extras.get("started", 0))
