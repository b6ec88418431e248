"""Usage for chargeback: the audit trail's records, verified as they are read, summed per
tenant, principal, model and deployment, and priced when prices are given.

Tenants and principals stay the keyed digests the records hold; only an operator's own file
of tenant ids and names (`names`) puts names next to them in a report, never in a record.
A record counts when it reached a deployment (a refusal never ran, so it bills nothing) and
its `time` lies in [start, end). The whole trail is verified: a report over a trail that
fails verification is refused with the reason, never printed in part.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.audit import verify_files

KEY = ("tenant", "principal", "model", "deployment")
TOKENS = ("prompt_tokens", "completion_tokens", "cached_tokens")
FIGURES = ("requests", *TOKENS, "kv_block_seconds", "engine_ms")
MILLION = Decimal(1_000_000)


class UsageError(Exception):
    """A report that cannot be made; the message is safe to print (seq numbers, never contents)."""


class TrailRejected(UsageError):
    """The audit trail failed verification: tampered, broken, or (strict) unverified."""


class ModelPrice(BaseModel):
    """Prices of one model: per million tokens, and per KV block held for an hour."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt_per_1m: Decimal = Field(Decimal(0), ge=0)
    completion_per_1m: Decimal = Field(Decimal(0), ge=0)
    cached_per_1m: Decimal | None = Field(None, ge=0)  # default: the prompt price
    kv_block_hour: Decimal = Field(Decimal(0), ge=0)

    def cost(self, row: dict) -> Decimal:
        # Cached tokens are part of the prompt tokens (as in OpenAI's usage): the rest pays the prompt price.
        cached = self.prompt_per_1m if self.cached_per_1m is None else self.cached_per_1m
        tokens = ((row["prompt_tokens"] - row["cached_tokens"]) * self.prompt_per_1m
                  + row["cached_tokens"] * cached + row["completion_tokens"] * self.completion_per_1m) / MILLION
        return tokens + Decimal(str(row["kv_block_seconds"])) / 3600 * self.kv_block_hour


class Prices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    currency: str = Field("USD", min_length=1, max_length=8)
    models: dict[str, ModelPrice]


def load_prices(path: str | Path) -> Prices:
    try:
        return Prices.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read prices {path}: {exc.strerror}") from None
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise UsageError(f"prices {path}: {where}: {first['msg']}") from None


def load_names(path: str | Path) -> dict[str, str]:
    """The operator's file of tenant ids -> names (JSON object)."""
    try:
        names = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read names {path}: {exc.strerror}") from None
    except ValueError:
        raise UsageError(f"names {path} is not JSON") from None
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise UsageError(f"names {path} must be a JSON object of tenant ids to names")
    return names


def parse_time(value: str, what: str) -> float:
    """Seconds since the epoch, from an ISO 8601 date or time (UTC unless it says otherwise)."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{what} must be an ISO 8601 date or time, "
                         "such as 2026-12-01 or 2026-12-01T10:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Usage:
    start: float
    end: float
    rows: dict[tuple, dict] = field(default_factory=dict)  # KEY values -> FIGURES
    audit: dict = field(default_factory=dict)  # what the verifier found: counts, warnings

    def add(self, entry: dict) -> None:
        at, usage = entry.get("time"), entry.get("usage")
        if entry.get("type") != "record" or not isinstance(usage, dict) or entry.get("deployment") is None:
            return
        if type(at) not in (int, float):
            return
        moment = cast(float, at)  # an int or a float, as the test above says
        if not (math.isfinite(moment) and self.start <= moment < self.end):
            return
        row = self.rows.setdefault(tuple(entry.get(k) for k in KEY), dict.fromkeys(FIGURES, 0))
        row["requests"] += 1
        for name in TOKENS:
            row[name] += _number(usage.get(name))
        engine = entry["engine"] if isinstance(entry.get("engine"), dict) else {}
        row["kv_block_seconds"] += _number(engine.get("kv_block_seconds"))
        row["engine_ms"] += _number(engine.get("engine_ms"))

    def document(self, prices: Prices | None = None, names: dict[str, str] | None = None) -> dict:
        """The report as JSON: rows, totals and the verification it rests on."""
        rows, unpriced = [], set()
        totals: dict[str, Any] = dict.fromkeys(FIGURES, 0)
        cost = Decimal(0)
        for key in sorted(self.rows, key=lambda k: tuple("" if v is None else str(v) for v in k)):
            figures = self.rows[key]
            row = dict(zip(KEY, key))
            if names is not None:
                row["tenant_name"] = names.get(row["tenant"])
            row |= {k: _rounded(k, v) for k, v in figures.items()}
            if prices is not None:
                price = prices.models.get(row["model"])
                if price is None:
                    unpriced.add(row["model"])
                    row["cost"] = None
                else:
                    row_cost = price.cost(figures)
                    cost += row_cost
                    row["cost"] = _money(row_cost)
            for k in FIGURES:
                totals[k] += figures[k]
            rows.append(row)
        totals = {k: _rounded(k, v) for k, v in totals.items()}
        document = {"from": _iso(self.start), "to": _iso(self.end), "rows": rows, "totals": totals,
                    "audit": self.audit}
        if prices is not None:
            totals["cost"] = _money(cost)
            document |= {"currency": prices.currency, "unpriced_models": sorted(map(str, unpriced))}
        return document


def to_csv(document: dict) -> str:
    """One line per row, the columns of the JSON rows; the totals are the columns' sums."""
    out = io.StringIO()
    columns = list(document["rows"][0]) if document["rows"] else [*KEY, *FIGURES]
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(document["rows"])
    return out.getvalue()


def _number(value: object) -> int | float:
    if type(value) not in (int, float):
        return 0
    number = cast(float, value)  # an int or a float, as the test above says
    return number if math.isfinite(number) and number >= 0 else 0


def _rounded(name: str, value: int | float) -> int | float:
    return round(value, 6 if name == "kv_block_seconds" else 3) if isinstance(value, float) else value


def _money(value: Decimal) -> float:
    return float(value.quantize(Decimal("0.000001")))


def read_usage(paths: Sequence[str | Path], public_keys: Sequence, start: float, end: float, *,
               strict: bool = False) -> Usage:
    """Reads and verifies the audit files (oldest first) in one pass; raises UsageError unless
    the whole trail verifies."""
    if not start < end:
        raise UsageError("the range is empty: --from must be before --to")
    usage = Usage(start, end)

    def on_line(line: bytes) -> None:
        try:
            entry = json.loads(line)
        except ValueError:  # not an entry: the verifier judges it
            return
        if isinstance(entry, dict):
            usage.add(entry)

    try:
        report = verify_files(paths, public_keys, strict=strict, on_line=on_line)
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename or 'an audit file'}: {exc.strerror}") from None
    if not report.ok:
        where = f" (chain {report.chain})" if report.chain else ""
        raise TrailRejected(f"the audit trail is {report.verdict}: {report.reason}{where}; no report is made")
    if report.records + report.checkpoints == 0:
        raise UsageError("no audit entries to report on")
    usage.audit = {"verdict": report.verdict, "records": report.records, "checkpoints": report.checkpoints,
                   "chains": report.chains, "warnings": report.warnings}
    return usage
