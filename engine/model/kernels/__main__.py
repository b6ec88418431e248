"""`python -m engine.model.kernels`: build the quantized-weight kernels where the engine looks first.

`make install` runs it, so that an engine's first start loads a built library instead of running
g++ (seconds) before it can serve. A machine that cannot build them (no compiler) still installs:
this prints why and exits 0, and the engine serves dequantized weights, or builds the kernels into
its cache on first use once a compiler is there. With --strict (the image's build stage, which has
the compiler its run stage lacks) a failed build exits 1 instead.
"""

from __future__ import annotations

import argparse
import sys
import time

from engine.model import kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.model.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 where the kernels cannot be built")
    args = parser.parse_args(argv)
    start = time.monotonic()
    if kernels.installed_library() is not None:
        print(f"quantized-weight kernels: already built in {kernels.INSTALLED_DIR}")
        return 0
    try:
        kernels.build(kernels.INSTALLED_DIR)
    except Exception as exc:  # noqa: BLE001 - any build failure leaves the engine its fallbacks
        print(f"quantized-weight kernels not built ({kernels.why_not(exc)}); the engine will "
              "build them on first use or serve dequantized weights", file=sys.stderr)
        return 1 if args.strict else 0
    print(f"quantized-weight kernels: built in {kernels.INSTALLED_DIR} in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
