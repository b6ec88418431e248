"""engine/__init__.py: every public name resolves, and `import engine` stays free of torch."""

import subprocess
import sys

import pytest

import engine

# Public names whose modules do not import torch: the gateway's torch-free paths use them.
TORCH_FREE = [
    "CacheScope", "ExecutionEnvelope", "Isolation", "keyed_digest", "local_envelope", "tenant_tag",
    "SamplingParams", "MAX_LOGIT_BIAS", "MAX_LOGIT_BIAS_TOKENS", "MAX_PENALTY", "EngineConfig", "Tokenizer",
    "PendingRecords", "PrometheusSink", "StepHistory", "RequestError", "EngineDeadError", "TokenizerError",
    "SamplingParamsError", "EnvelopeError", "ModelNotFoundError", "EncoderError",
]


def test_every_public_name_resolves():
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert set(engine.__all__) <= set(dir(engine))
    assert set(TORCH_FREE) <= set(engine.__all__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LLM'"):
        engine.LLM
    with pytest.raises(ImportError):
        from engine import LLM  # noqa: F401


def test_every_exported_exception_is_defined_in_engine_errors():
    values = [getattr(engine, name) for name in engine.__all__]
    errors = [value for value in values if isinstance(value, type) and issubclass(value, Exception)]
    assert len(errors) == 10
    assert {error.__module__ for error in errors} == {"engine.errors"}


def test_importing_the_light_names_does_not_import_torch():
    probe = f"import sys\nfrom engine import {', '.join(TORCH_FREE)}\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"

