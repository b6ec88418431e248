"""The backends the gateway hands requests to have what the InferenceBackend protocol declares:
the gateway reads the members directly (the console reads `steps`), never probes for them."""

from __future__ import annotations

from engine import EngineConfig, LLMEngine, StepHistory
from gateway.inference import EngineBackend, InferenceBackend, NullBackend
from tests.utils.protocols import protocol_members


def test_every_backend_has_every_member_the_protocol_declares(demo_model_dir) -> None:
    declared = protocol_members(InferenceBackend)
    assert {"steps", "generate", "engine_record"} <= declared
    engine = LLMEngine(EngineConfig(model=str(demo_model_dir), kv_cache_memory_bytes=8 << 20, max_num_seqs=2,
                                    max_model_len=256))
    null, embedded = NullBackend(), EngineBackend(engine, model_name="demo")  # neither started
    for backend in (null, embedded):
        assert all(hasattr(backend, name) for name in declared), type(backend).__name__
    assert null.steps is None and isinstance(embedded.steps, StepHistory)  # None: no engine, no steps
