"""The quantized kernels' build on a thread (kernels.load_in_background), started by LLMEngine while
it converts a GGUF file: one build per process whoever asks first, none where the engine will not
use them, and a failed build still means one warning and dequantized weights."""

import logging
import threading
import time

import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model import kernels
from tests.utils.gguf_files import write_tiny_gguf


def engine_for(path, weights: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory_bytes=16 << 20, weights=weights,
                                  device="cpu"))


def test_the_thread_and_the_runner_share_one_build(tmp_path, monkeypatch):
    calls, release = [], threading.Event()

    def slow_build(cache_dir):
        calls.append(cache_dir)
        release.wait(5)
        return kernels.Kernels(0)

    monkeypatch.setattr(kernels, "_load", slow_build)
    monkeypatch.setattr(kernels, "_loaded", {})
    thread = kernels.load_in_background(tmp_path)
    assert thread is not None and thread.name == "tenantgate-kernels-build" and not thread.daemon
    waiter = threading.Thread(target=lambda: calls.append(kernels.load(tmp_path)))
    waiter.start()
    time.sleep(0.1)
    release.set()
    thread.join(5)
    waiter.join(5)
    assert kernels.load(tmp_path) == kernels.Kernels(0)
    assert calls == [tmp_path, kernels.Kernels(0)]  # built once; the second caller got its result
    assert kernels.load_in_background(tmp_path) is None  # loaded: nothing to start


@pytest.fixture
def started(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "load_in_background", lambda cache_dir: calls.append(cache_dir))
    return calls


def test_no_build_for_dequantized_weights_or_a_checkpoint_without_packed_weights(tmp_path, demo_model_dir,
                                                                                 started):
    path = write_tiny_gguf(tmp_path / "q.gguf", demo_model_dir, qtype="Q4_1")
    assert engine_for(path, "dequantized").runner.weights == "dequantized"
    assert engine_for(demo_model_dir, "auto").runner.weights == "dequantized"
    assert started == []


def test_a_gguf_model_on_cpu_starts_the_build_before_converting(tmp_path, demo_model_dir, monkeypatch):
    path = write_tiny_gguf(tmp_path / "q.gguf", demo_model_dir, qtype="Q4_1", seed=30)  # not converted yet
    order = []
    monkeypatch.setattr(kernels, "load_in_background", lambda cache_dir: order.append("build"))
    import engine.model.gguf as gguf_module

    convert = gguf_module.convert_gguf
    monkeypatch.setattr(gguf_module, "convert_gguf", lambda *a, **k: (order.append("convert"), convert(*a, **k)))
    engine_for(path, "auto")
    assert order == ["build", "convert"]


def test_a_build_that_fails_on_its_thread_means_one_warning_and_dequantized_weights(tmp_path, demo_model_dir,
                                                                                     monkeypatch, caplog):
    from torch.utils import cpp_extension

    path = write_tiny_gguf(tmp_path / "q.gguf", demo_model_dir, qtype="Q4_1")
    builds = []

    def broken(**kwargs):
        builds.append(threading.current_thread().name)
        raise RuntimeError("qmatmul.cpp:1: error: no compiler here")

    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(kernels, "_loaded", {})
    with caplog.at_level(logging.INFO):
        engine = engine_for(path, "auto")
    assert engine.runner.weights == "dequantized"
    assert builds == ["tenantgate-kernels-build"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == kernels.__name__]
    assert warnings == ["quantized-weight kernels unavailable (RuntimeError: qmatmul.cpp:1: error: no compiler "
                        "here); serving dequantized weights"]
    assert any("serving dequantized weights: the quantized kernels could not be built" in r.getMessage()
               for r in caplog.records)
