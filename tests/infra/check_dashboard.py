"""Checks a Grafana dashboard JSON against the dashboard schema's models in grafana-foundation-sdk.

Run with the infra tools' interpreter (the SDK lives in .venv-infra/grafana-foundation-sdk):

    .venv-infra/bin/python tests/infra/check_dashboard.py infra/helm/tenantgate/files/dashboard.json

The SDK's models are generated from Grafana's dashboard schema (the CUE kinds), panel and query
types included. The dashboard is read into them and written back: a field the schema does not
have is dropped on the way, and each such path is printed, one per line (so is a value that
comes back different). The models do not check value types. Exit status 0 when nothing was
lost, 1 when something was, 2 when the file cannot be read as a dashboard.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda model: model.to_json()))


def _not_kept(given: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [f"{path or '.'}: not an object in the schema"]
        found = []
        for key, value in given.items():
            found += ([f"{path}.{key}: not in the schema"] if key not in kept
                      else _not_kept(value, kept[key], f"{path}.{key}"))
        return found
    if isinstance(given, list):
        if not isinstance(kept, list) or len(given) != len(kept):
            return [f"{path}: not a list in the schema"]
        return [found for index, pair in enumerate(zip(given, kept)) for found in _not_kept(*pair, f"{path}[{index}]")]
    return [] if given == kept else [f"{path}: {given!r} became {kept!r}"]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".venv-infra" / "grafana-foundation-sdk"))
    from grafana_foundation_sdk.cog import plugins  # lives in .venv-infra only
    from grafana_foundation_sdk.models.dashboard import Dashboard

    if len(argv) != 2:
        print("usage: check_dashboard.py DASHBOARD.json", file=sys.stderr)
        return 2
    plugins.register_default_plugins()
    try:
        given = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        kept = _plain(Dashboard.from_json(given))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        print(f"cannot read {argv[1]} as a dashboard: {exc}", file=sys.stderr)
        return 2
    problems = _not_kept(given, kept)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
