"""The quantized kernels' build: at install time (`python -m engine.model.kernels`), whose library a
first start loads without a compiler; else on a thread (kernels.load_in_background), started by
LLMEngine while it converts a GGUF file: one build per process whoever asks first, none where the
engine will not use them, and a failed build still means one warning and dequantized weights."""

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model import kernels
from engine.paths import default_cache_dir
from tests.utils.gguf_files import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
# One fresh process: kernels.INSTALLED_DIR set to argv[1], torch's extension builder made to fail when
# argv[2] is "no-compiler"; prints what load() gave and which kernel directories the cache holds.
PROBE = """
import json, sys
from pathlib import Path
from engine.model import kernels
from engine.paths import default_cache_dir
kernels.INSTALLED_DIR = Path(sys.argv[1])
if sys.argv[2] == "no-compiler":
    from torch.utils import cpp_extension
    def refuse(**kwargs):
        raise RuntimeError("error: no compiler in this probe")
    cpp_extension.load = refuse
loaded = kernels.load(default_cache_dir())
built = sorted(p.name for p in (default_cache_dir() / "kernels").glob("*/*.so"))
print(json.dumps({"isa": None if loaded is None else loaded.isa, "cache": built}))
"""


def probe(installed_dir: Path, cache_dir: Path, compiler: str) -> dict:
    env = dict(os.environ, TENANTGATE_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", PROBE, str(installed_dir), compiler], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built_library() -> Path:
    """This source's library, built once: where `make install` put it, else in the cache."""
    assert kernels.load(default_cache_dir()) is not None
    installed = kernels.installed_library()
    if installed is not None:
        return installed
    return next((default_cache_dir() / "kernels").glob(f"qmatmul-{kernels.build_key()}/*.so"))


def test_a_first_start_loads_the_library_built_at_install_time_and_compiles_nothing(tmp_path, built_library):
    installed = tmp_path / "installed" / f"qmatmul-{kernels.build_key()}"
    installed.mkdir(parents=True)
    shutil.copy(built_library, installed / f"{kernels.library_name()}.so")
    loaded = probe(tmp_path / "installed", tmp_path / "cache", "no-compiler")
    assert loaded == {"isa": kernels.load(default_cache_dir()).isa, "cache": []}


def test_without_an_installed_library_the_first_use_builds_into_the_cache_and_the_next_process_reuses_it(tmp_path):
    library = f"{kernels.library_name()}.so"
    first = probe(tmp_path / "none", tmp_path / "cache", "compiler")  # g++: seconds
    assert first["isa"] is not None and first["cache"] == [library]
    built = next((tmp_path / "cache" / "kernels").glob(f"*/{library}"))
    stamp = built.stat().st_mtime_ns
    second = probe(tmp_path / "none", tmp_path / "cache", "compiler")
    assert second == first and built.stat().st_mtime_ns == stamp  # loaded, not linked again


def test_the_install_step_builds_once_and_a_machine_without_a_compiler_still_installs(built_library):
    again = subprocess.run([sys.executable, "-m", "engine.model.kernels"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and "quantized-weight kernels: " in again.stdout
    for flags, code in (([], 0), (["--strict"], 1)):  # --strict: the image's build stage fails instead
        no_compiler = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from torch.utils import cpp_extension; "
             "from engine.model import kernels; from engine.model.kernels.__main__ import main; "
             "kernels.INSTALLED_DIR = Path(sys.argv[1]); "
             "cpp_extension.load = lambda **k: (_ for _ in ()).throw(RuntimeError('x.cpp:1: error: no g++'));"
             "sys.exit(main(sys.argv[2:]))", "/nonexistent/tenantgate-kernels", *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert no_compiler.returncode == code, no_compiler.stderr
        assert "not built (RuntimeError: x.cpp:1: error: no g++)" in no_compiler.stderr


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
    monkeypatch.setattr(kernels, "INSTALLED_DIR", tmp_path / "not-installed")
    with caplog.at_level(logging.INFO):
        engine = engine_for(path, "auto")
    assert engine.runner.weights == "dequantized"
    assert builds == ["tenantgate-kernels-build"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == kernels.__name__]
    assert warnings == ["quantized-weight kernels unavailable (RuntimeError: qmatmul.cpp:1: error: no compiler "
                        "here); serving dequantized weights"]
    assert any("serving dequantized weights: the quantized kernels could not be built" in r.getMessage()
               for r in caplog.records)
