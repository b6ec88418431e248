"""Redaction throughput, and the same corpus through the libraries we weighed against it.

Printed: microseconds per message and MB/s of `Redactor.scrub` for a typical 4 KB chat
message (ASCII, then with non-ASCII text), a 4 KB message dense with numbers, one dense
with findings, one dense with findings spelled otherwise (fullwidth, other scripts'
digits, look-alike letters: the folding's slow path), and Japanese text. Target: a typical 4 KB message well under 1 ms.

With `--compare`, the corpus of devkit/redaction_samples.py also goes through
Presidio (pattern recognizers, no NLP model) and detect-secrets, where installed: recall
on the positives, false positives on the ordinary sentences, time per message.

    .venv/bin/python bench/redaction.py
    .venv/bin/python bench/redaction.py --compare    # needs presidio-analyzer, detect-secrets
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit.redaction_samples import EVASIONS, NEGATIVES, POSITIVES, Positive
from gateway.redaction import Redactor

TARGET_US = 1000.0
TYPICAL = (
    "You are a helpful assistant for Contoso's finance team. Answer concisely, cite the "
    "section of the policy you rely on, and never invent figures. If you are unsure, say so.\n\n"
    "Hi! I need help with the Q3 2026 quarterly report. Our revenue was $12.4M, up 8% from "
    "Q2, and operating costs rose to $9,870,000. Headcount went from 142 to 156 people. "
    "Can you draft an executive summary of about 300 words? Please mention the new office "
    "in Dublin that opened on 1 September, and the migration to Python 3.11.7 that finished "
    "in week 37. The board meets on 2026-10-14 at 09:30, so I need the draft by Friday.\n\n"
    "Here is the table we used last time:\n"
    "| Metric | Q2 | Q3 |\n| Revenue | 11.5 | 12.4 |\n| Costs | 9.1 | 9.87 |\n\n"
    "Also, the script below fails with KeyError: 'region'. What is wrong?\n"
    "```python\nimport csv\n\ndef load(path):\n    with open(path) as f:\n"
    "        rows = list(csv.DictReader(f))\n    return {r['region']: float(r['total']) for r in rows}\n```\n"
    "Thanks, and please keep the tone formal but friendly. "
)

JAPANESE = "会議は２０２６年５月１２日の１４：３０から、参加者は１２名です。資料は前日までに共有してください。"


def four_kb(text: str) -> str:
    return (text * (4096 // len(text) + 1))[:4096]


def per_call_us(function: Callable[[str], object], text: str, seconds: float = 1.0) -> float:
    """Best of five timed batches, so a busy machine reads as little as it can."""
    function(text)
    calls = max(1, int(seconds / 5 / max(_one_call(function, text), 1e-7)))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            function(text)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def _one_call(function: Callable[[str], object], text: str) -> float:
    start = time.perf_counter()
    function(text)
    return time.perf_counter() - start


def throughput(redactor: Redactor) -> None:
    messages = {
        "typical chat, ASCII": four_kb(TYPICAL),
        "typical chat, non-ASCII": four_kb(TYPICAL.replace("Dublin", "Dún Laoghaire €")),
        "ordinary sentences, number-dense": four_kb(" ".join(NEGATIVES)),
        "dense with findings": four_kb(" ".join(sample.text for sample in POSITIVES)),
        "dense with findings spelled otherwise": four_kb(" ".join(sample.text for sample in EVASIONS.values())),
        "Japanese chat, fullwidth digits": four_kb(JAPANESE),
    }
    print(f"{'message (4 KB)':36s} {'us/msg':>8s} {'MB/s':>7s}")
    for name, text in messages.items():
        us = per_call_us(redactor.scrub, text)
        print(f"{name:36s} {us:8.0f} {len(text.encode()) / us:7.1f}")
    typical = per_call_us(redactor.scrub, messages["typical chat, ASCII"])
    verdict = "meets" if typical <= TARGET_US else "MISSES"
    print(f"typical 4 KB message: {typical:.0f} us, {verdict} the {TARGET_US:.0f} us target")


def score(
    name: str,
    spans_of: Callable[[str], list[tuple[int, int]]],
    kinds: set[str] | None,
    samples: tuple[Positive, ...] = POSITIVES,
) -> None:
    """Recall: positives whose secret is wholly inside findings. FP: negatives with any finding."""
    positives = [sample for sample in samples if kinds is None or sample.kind in kinds]
    caught = 0
    for sample in positives:
        at = sample.text.find(sample.secret)
        covered = {i for start, end in spans_of(sample.text) for i in range(start, end)}
        caught += all(i in covered for i in range(at, at + len(sample.secret)))
    flagged = sum(bool(spans_of(sentence)) for sentence in NEGATIVES)
    us = per_call_us(spans_of, four_kb(TYPICAL), seconds=2.0)
    print(
        f"{name:34s} recall {caught:3d}/{len(positives):<3d} "
        f"false positives {flagged:2d}/{len(NEGATIVES)}  {us:8.0f} us per 4 KB"
    )


def compare(redactor: Redactor) -> None:
    pii = {"EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "IP_ADDRESS"}
    secrets = {sample.kind for sample in POSITIVES} - pii
    # scrub turns line breaks into spaces before it finds; find alone reads them as written
    def ours(text: str) -> list[tuple[int, int]]:
        return [(f.start, f.end) for f in redactor.find(re.sub("[\r\n]", " ", text))]

    score("tenantgate, all kinds", ours, None)
    score("tenantgate, personal data", ours, pii)
    score("tenantgate, secrets", ours, secrets)
    spelled = tuple(EVASIONS.values())
    score("tenantgate, spelled otherwise", ours, None, spelled)
    try:
        started = time.perf_counter()
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NoOpNlpEngine
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IbanRecognizer,
            IpRecognizer,
            PhoneRecognizer,
        )

        print(f"presidio-analyzer import: {time.perf_counter() - started:.1f} s")
        registry = RecognizerRegistry(
            recognizers=[
                EmailRecognizer(),
                PhoneRecognizer(),
                CreditCardRecognizer(),
                IbanRecognizer(),
                IpRecognizer(),
            ]
        )
        no_model = NoOpNlpEngine([{"lang_code": "en", "model_name": "none"}])
        engine = AnalyzerEngine(registry=registry, nlp_engine=no_model)

        def presidio(text: str) -> list[tuple[int, int]]:
            return [(r.start, r.end) for r in engine.analyze(text, language="en")]

        score("presidio (no NLP), personal data", presidio, pii)
        score("presidio (no NLP), secrets", presidio, secrets)
        score("presidio (no NLP), spelled otherwise", presidio, pii, spelled)
    except ImportError:
        print("presidio-analyzer: not installed")
    try:
        started = time.perf_counter()
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.settings import default_settings

        print(f"detect-secrets import: {time.perf_counter() - started:.1f} s")
        # Every plugin with its default settings; entropy plugins at their default limits
        # (scan_line's "eager" ad-hoc mode would report every word).
        plugins = [plugin() for plugin in get_mapping_from_secret_type_to_class().values()]

        def detect_secrets_spans(text: str) -> list[tuple[int, int]]:
            spans = []
            with default_settings():
                for line_number, line in enumerate(text.splitlines(), start=1):
                    for plugin in plugins:
                        for found in plugin.analyze_line(filename="prompt.txt", line=line, line_number=line_number):
                            value = found.secret_value or ""
                            at = text.find(value) if value else -1
                            while at >= 0:
                                spans.append((at, at + len(value)))
                                at = text.find(value, at + 1)
            return spans

        score("detect-secrets, secrets", detect_secrets_spans, secrets)
        score("detect-secrets, personal data", detect_secrets_spans, pii)
        score("detect-secrets, spelled otherwise", detect_secrets_spans, secrets, spelled)
    except ImportError:
        print("detect-secrets: not installed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="also run Presidio and detect-secrets")
    args = parser.parse_args()
    redactor = Redactor(os.urandom(32))
    print("load average: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    throughput(redactor)
    if args.compare:
        compare(redactor)


if __name__ == "__main__":
    main()
