"""What start-up built is frozen out of the cyclic collector's reach (gateway/app.py, freeze_startup_heap):
a full collection then walks the requests' objects, not the whole process, on the shared loop."""

from __future__ import annotations

import gc

import httpx

from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from tests.gateway.api.conftest import gateway_settings


def test_start_up_freezes_the_heap_it_built(local_issuer) -> None:
    gc.unfreeze()  # whatever an earlier test's app froze
    assert gc.get_freeze_count() == 0
    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=NullBackend(model_name="demo"))
    with serving(app) as base:
        assert httpx.get(base + "/readyz").status_code == 200
        frozen = gc.get_freeze_count()
    assert frozen > 10_000, frozen  # the modules, the policy and the app: about 118,000 objects in the bench
