"""The Triton paged-attention kernel equals the engine's torch attention, on CPU under Triton's interpreter.

triton.jit chooses interpreter or compiler when a function is decorated, from
TRITON_INTERPRET, and triton's own library functions (tl.zeros, tl.max, ...) are
decorated when triton is first imported, which torch may already have done in this
process. So the cases (tests/utils/triton_cases.py: decode, extend over a cached prefix,
GQA 1:1, 3:1 and 4:1, sliding window, block tables with holes and shared prefix blocks,
bfloat16, and the model runner's kernel path end to end)
run in one child process that has the variable from the start; no other test sees it.
Tolerance and shapes are stated there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.triton_cases import CASES, ENGINE_CASES

pytest.importorskip("triton", reason="triton is not installed (it ships with CUDA builds of torch)")

TIMEOUT_S = 240
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(llama_dir) -> dict[str, str | None]:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "tests.utils.triton_cases", str(llama_dir)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {line["case"]: line["error"] for line in lines}


@pytest.mark.parametrize("case", sorted(CASES | ENGINE_CASES))
def test_triton_kernel_under_interpreter(results, case):
    assert case in results, f"the child process did not report {case}"
    assert results[case] is None, results[case]
