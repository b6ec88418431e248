"""GET /v1/models: only the models the caller's tenant may use, as policy says."""

from fastapi import APIRouter

from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.deps import CallDep
from gateway.errors import GatewayError, ModelNotFound, PolicyDenied
from gateway.middleware import new_edge_request_id
from gateway.openai.openapi import ERROR_RESPONSES
from gateway.openai.protocol import Model, ModelList
from gateway.pipeline.admission import judge, policy_input
from gateway.pipeline.exchange import Exchange

router = APIRouter()


async def _allowed(gateway: Gateway, principal: Principal, exchange: Exchange, model: str) -> bool:
    # The same question a one-token completion would ask, so the list never promises a model
    # that a request for it would be refused.
    document = policy_input(gateway, principal, exchange, route="models.list", model=model, stream=False,
                            prompt_tokens=1, max_tokens=1, temperature=None)
    try:
        await judge(gateway, exchange, document)
    except PolicyDenied:
        return False
    return True


def _audit(gateway: Gateway, principal: Principal, exchange: Exchange, route: str, status: int, outcome: str,
           model: str | None, listed: int | None) -> None:
    """A model listing leaves its record as every judged request does: who asked, under which
    policy, and what they were told (how many models; the one named, if this gateway serves it)."""
    request_id = new_edge_request_id()
    exchange.request_id = request_id
    gateway.audit.write({
        "request_id": request_id, "route": route, **gateway.audit.principal_digests(principal),
        "policy_revision": gateway.policy.revision, "decision": None,
        "model": model if model in gateway.models else None, "deployment": None, "models_listed": listed,
        "status": status, "outcome": outcome,
    })


@router.get("/v1/models", responses=ERROR_RESPONSES, summary="List the models this caller may use")
async def list_models(call: CallDep) -> ModelList:
    gateway, exchange, principal = call.gateway, call.exchange, call.principal
    try:
        models = [name for name in gateway.models if await _allowed(gateway, principal, exchange, name)]
    except GatewayError as exc:
        _audit(gateway, principal, exchange, "models.list", exc.status_code, exc.code or exc.type, None, None)
        raise
    _audit(gateway, principal, exchange, "models.list", 200, "listed", None, len(models))
    return ModelList(data=[Model(id=m, created=gateway.started) for m in models])


@router.get("/v1/models/{model}", responses=ERROR_RESPONSES, summary="Describe one model")
async def retrieve_model(model: str, call: CallDep) -> Model:
    gateway, exchange, principal = call.gateway, call.exchange, call.principal
    try:
        if model not in gateway.models or not await _allowed(gateway, principal, exchange, model):
            raise ModelNotFound()
    except GatewayError as exc:
        _audit(gateway, principal, exchange, "models.retrieve", exc.status_code, exc.code or exc.type, model, None)
        raise
    _audit(gateway, principal, exchange, "models.retrieve", 200, "listed", model, 1)
    return Model(id=model, created=gateway.started)
