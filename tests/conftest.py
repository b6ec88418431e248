from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def tenantgate_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Points the tenantgate cache at a temporary directory, so tests never touch ~/.cache."""
    cache_dir = tmp_path_factory.mktemp("tenantgate-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TENANTGATE_CACHE_DIR", str(cache_dir))
        yield cache_dir


@pytest.fixture(scope="session")
def demo_model_dir(tenantgate_cache_dir: Path) -> Path:
    """The demo checkpoint, built once per test session in the temporary cache."""
    from engine.model.demo import ensure_demo_model

    return ensure_demo_model(progress=False)
