"""engine/__init__.py: every public name resolves, `import engine` stays free of torch, and the
import contract covers every module behind the API."""

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import engine

ROOT = Path(__file__).resolve().parents[2]
# Faces of their own, imported beside the root API (engine/__init__.py says why).
OWN_FACES = {"engine.remote", "engine.cli", "engine.paths"}
# Public names whose modules do not import torch: the gateway's torch-free paths use them.
TORCH_FREE = [
    "random_hex", "random_uuid",
    "CacheScope", "ExecutionEnvelope", "Isolation", "keyed_digest", "local_envelope", "tenant_digest",
    "SamplingParams", "MAX_LOGIT_BIAS", "MAX_LOGIT_BIAS_TOKENS", "MAX_PENALTY", "EngineConfig", "Tokenizer",
    "PendingRecords", "PrometheusSink", "StepHistory", "RequestError", "EngineDeadError", "TokenizerError",
    "SamplingParamsError", "EnvelopeError", "ModelNotFoundError", "EncoderError", "RequestOutput", "TokenLogprobs",
    "DEFAULT_MODEL", "served_model_name",
]


def test_every_public_name_resolves():
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert set(engine.__all__) <= set(dir(engine))
    assert set(TORCH_FREE) <= set(engine.__all__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LLM'"):
        engine.LLM  # noqa: B018 - reading it is what raises
    with pytest.raises(ImportError):
        from engine import LLM  # noqa: F401 - importing it is what fails


def test_every_exported_exception_is_defined_in_engine_errors():
    values = [getattr(engine, name) for name in engine.__all__]
    errors = [value for value in values if isinstance(value, type) and issubclass(value, Exception)]
    assert len(errors) == 10
    assert {error.__module__ for error in errors} == {"engine.errors"}


def test_importing_the_light_names_does_not_import_torch():
    probe = f"import sys\nfrom engine import {', '.join(TORCH_FREE)}\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"


def test_the_import_contract_protects_every_module_behind_the_api():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "protected"]
    modules = {f"engine.{info.name}" for info in pkgutil.iter_modules(engine.__path__)}
    assert OWN_FACES <= modules
    assert set(contract["protected_modules"]) == modules - OWN_FACES


@pytest.mark.parametrize("module", ["gateway.main", "gateway.app", "engine.remote"])
def test_the_command_line_and_the_app_load_without_torch(module):
    """`tenantgate token`, `policy`, `audit` start without torch's seconds of import; the engine
    loads it once a model is wanted."""
    probe = f"import sys\nimport {module}\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"
