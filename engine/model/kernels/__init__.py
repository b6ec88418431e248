"""The CPU kernels that read quantized weights in place (qmatmul.cpp), built at install time.

The source is compiled once per source, torch build and machine type with torch's own extension
builder. `make install` builds it beside this file (`python -m engine.model.kernels`, into
`build/`), the way a wheel ships its compiled extension, so a first start only loads it. Where no
such library matches (the source edited since, another torch, an install that could not build),
the first use builds one under `<cache>/kernels/`, the way a GGUF conversion is cached, and a second
process finds it there. Where it cannot be built (no compiler, no ninja, a read-only cache),
`load()` says why in one log line and returns None, and the engine serves dequantized weights
instead. `load_in_background()` starts the same load on a thread, so that a build (seconds of g++)
runs while the engine converts the GGUF file; `load()` then waits for it, and the library is built
and loaded once per process whoever asks first.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("qmatmul.cpp")
# Instruction sets, as qmatmul.cpp numbers them; the kernels never run one the CPU lacks.
ISA_NAMES = ("scalar", "avx2", "avx512", "avx512-bf16", "avx512-bf16-amx")
AVX2 = 1  # AVX2 + FMA: fp32 calls of TILED_MIN_ROWS rows or more run qlinear_tiled
BF16 = 3  # AVX512-BF16: bfloat16 activations run qlinear_bf16
AMX = 4  # AVX512-BF16 and AMX-BF16 (the kernel allows it): bfloat16 calls of 32 rows and more run qlinear_amx
# -ffp-contract=off: weights are dequantized as a multiply then an add, two roundings, as the
# gguf package does, so they equal the dequantized checkpoint's bit for bit.
_CFLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-std=c++17"]
# Where `make install` puts the library; a source tree or a site-packages copy alike.
INSTALLED_DIR = Path(__file__).with_name("build")


@dataclass(frozen=True)
class Kernels:
    """The loaded library: torch.ops.tenantgate_quant and the instruction set this CPU gets."""

    isa: int

    @property
    def isa_name(self) -> str:
        return ISA_NAMES[self.isa]

    @property
    def ops(self):
        return torch.ops.tenantgate_quant


def build_key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI), platform.machine(), " ".join(_CFLAGS)):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


# One load per cache directory and process: the first caller builds, later ones (the background
# thread's or the runner's) wait on the lock and get its result.
_lock = threading.Lock()
_loaded: dict[Path, Kernels | None] = {}


def load(cache_dir: Path) -> Kernels | None:
    """The kernels, built into cache_dir on first use; None (and a log line saying why) where they cannot be."""
    cache_dir = Path(cache_dir)
    with _lock:
        if cache_dir not in _loaded:
            _loaded[cache_dir] = _load(cache_dir)
        return _loaded[cache_dir]


def load_in_background(cache_dir: Path) -> threading.Thread | None:
    """Start load(cache_dir) on a thread unless it has run; None where it has.

    Not a daemon: an interpreter that exits mid-build waits for it rather than leave torch's build
    lock behind in the cache (a later build would wait on it forever).
    """
    with _lock:
        if Path(cache_dir) in _loaded:
            return None
    thread = threading.Thread(target=load, args=(cache_dir,), name="tenantgate-kernels-build")
    thread.start()
    return thread


def library_name() -> str:
    return f"tenantgate_qmatmul_{build_key()}"


def library_path(directory: Path) -> Path:
    """Where build(directory) puts the library for this source, torch and machine."""
    return Path(directory) / f"qmatmul-{build_key()}" / f"{library_name()}.so"


def installed_library() -> Path | None:
    """The library `make install` built for this source, torch and machine; None where there is none."""
    path = library_path(INSTALLED_DIR)
    return path if path.is_file() else None


def build(directory: Path) -> None:
    """Compile the library into directory/qmatmul-<key>/ and load it (g++ through torch's builder and ninja)."""
    from torch.utils import cpp_extension

    build_dir = library_path(directory).parent
    build_dir.mkdir(parents=True, exist_ok=True)
    with _ninja_on_path():
        cpp_extension.load(name=library_name(), sources=[str(SOURCE)], extra_cflags=_CFLAGS,
                           build_directory=str(build_dir), is_python_module=False, verbose=False)


def why_not(exc: Exception) -> str:
    """A failed build or load in one line: a compiler's own message says more than the builder's first line."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    reason = next((line for line in lines if "error:" in line), lines[0]).strip()
    return f"{type(exc).__name__}: {reason[:200]}"


def _load(cache_dir: Path) -> Kernels | None:
    start = time.monotonic()
    installed = installed_library()
    fresh = False
    try:
        if installed is not None:
            torch.ops.load_library(str(installed))
        else:
            fresh = not library_path(Path(cache_dir) / "kernels").is_file()
            if fresh:
                logger.info("building the quantized-weight kernels (first use; later starts reuse them)")
            build(Path(cache_dir) / "kernels")
        isa = int(torch.ops.tenantgate_quant.cpu_isa())
    except Exception as exc:  # noqa: BLE001 - a compiler error, no compiler or ninja, an unwritable cache: all mean the same here
        logger.warning("quantized-weight kernels unavailable (%s); serving dequantized weights", why_not(exc))
        return None
    if fresh:
        logger.info("built the quantized-weight kernels in %.1f s", time.monotonic() - start)
    logger.info("quantized-weight kernels: %s", ISA_NAMES[isa])
    return Kernels(isa)


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's builder runs `ninja`; the ninja wheel's binary is beside this interpreter, maybe not on PATH."""
    path = os.environ.get("PATH")
    try:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + (os.pathsep + path if path else "")
    except ImportError:
        pass
    try:
        yield
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path
