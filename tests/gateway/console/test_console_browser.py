"""The operator console in a real browser: headless chromium (Debian's, driven by Selenium)
signs in with a token from `tenantgate token` (the dev issuer), after a mixed multi-tenant run
through the official SDK (served, denied and throttled requests of four tenants, a KV pool small
enough to evict, quotas in a real Redis), loads every view, and checks each number against
/metrics, the audit trail and the engine's own step records. Screenshots of every view are kept
(see tests/utils/browser.py for where)."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.cli import create_dev_app as create_app
from devkit.redis import RedisServer
from devkit.server import TENANTGATE, free_port, gateway_env, serving
from engine import EngineConfig, ListSink, LLMEngine, PrometheusSink
from gateway.audit import load_or_create_signing_key, verify_files
from gateway.console import VIEWS
from gateway.inference import EngineBackend
from gateway.metrics import GatewayMetrics
from gateway.operator import OPERATOR_ROLE
from tests.gateway.api.conftest import ALPHA, AUDIENCE, BETA, EPSILON, GAMMA, PLATFORM, gateway_settings
from tests.utils.browser import artifacts_dir, chromium, full_page_screenshot

CANARY = "console-canary-7f3a9c"  # in a prompt: must appear on no page
TOPICS = ["harbours and lighthouses", "glaciers and fjords", "deserts at night", "old libraries", "rain forests",
          "city trains"]


def _prompt(topic: str, words: int = 40) -> str:
    return f"Write about {topic}. " + " ".join(f"{topic.split()[0]}{i}" for i in range(words))


@pytest.fixture(scope="module")
def console(local_issuer, demo_model_dir, redis_binary, tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A gateway of its own (its trail gets tampered with at the end), the dev issuer, Redis quotas,
    an engine with 24 KV blocks, and the run's answers as each client saw them."""
    root = tmp_path_factory.mktemp("console")
    redis = RedisServer(redis_binary, root).start()
    settings = gateway_settings(local_issuer, audit_file=root / "audit.jsonl", audit_signing_key=root / "audit.pem",
                                dev_issuer=True, dev_issuer_port=free_port(), redis_url=redis.url)
    sink = ListSink()
    engine = LLMEngine(EngineConfig(model=str(demo_model_dir), num_kv_blocks=24, block_size=16, max_num_seqs=4,
                                    max_model_len=384), sinks=[sink])
    metrics = GatewayMetrics()
    engine_metrics = PrometheusSink(metrics.registry)
    engine.sinks.append(engine_metrics)
    engine_metrics.watch(engine)
    app = create_app(settings, backend=EngineBackend(engine, model_name="demo"), metrics=metrics)
    try:
        with serving(app) as base_url:
            state = app.state.gateway
            answers = _mixed_run(base_url, state.issuer)
            yield SimpleNamespace(base_url=base_url, operator_url=f"http://127.0.0.1:{settings.metrics_port}",
                                  settings=settings, state=state, sink=sink, answers=answers, root=root,
                                  dev_issuer_url=state.issuer.base_url)
            state.backend.async_engine.shutdown()
    finally:
        redis.stop()


def _mixed_run(base_url: str, issuer) -> dict[str, list]:
    """Per tenant, (status, x-ratelimit headers) of each answer, in order."""
    answers = defaultdict(list)

    def send(tenant: str, content: str, max_tokens: int, headers: dict | None = None) -> None:
        token = issuer.mint(tenant, audience=AUDIENCE)
        with openai.OpenAI(base_url=base_url + "/v1", api_key=token, max_retries=0, timeout=60) as client:
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="demo", messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
                    temperature=0, extra_headers=headers)
                raw.parse()
                status, headers = raw.status_code, raw.headers
            except openai.APIStatusError as exc:
                status, headers = exc.status_code, exc.response.headers
        answers[tenant].append((status, {k: v for k, v in headers.items() if k.startswith("x-ratelimit-")}))

    for topic in TOPICS:  # Alpha: distinct prompts, more than the pool caches (its cache is evicted)
        send(ALPHA, _prompt(topic) + (f" {CANARY}" if topic == TOPICS[0] else ""), 8)
    for _ in range(3):  # Gamma: one public prompt thrice, in the shared scope (prefix hits)
        send(GAMMA, _prompt("mountain lakes"), 4, {"x-data-classification": "public"})
    send(ALPHA, _prompt(TOPICS[-1]), 8)  # Alpha's last prompt again (a tenant-scope hit)
    for _ in range(2):  # Beta may not use the model: denied by policy
        send(BETA, "hello", 4)
    for _ in range(3):  # Epsilon: 2 requests a minute, the third throttled
        send(EPSILON, "hello there", 4)
    return answers


# -- the figures the pages must show, from /metrics, the trail and the engine ------------------


def _scrape(console) -> dict[str, list]:
    import httpx

    text = httpx.get(console.operator_url + "/metrics", timeout=10).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _records(console) -> list[dict]:
    lines = console.settings.audit_file.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "record" and e.get("route") == "chat.completions"]


def _digest(console, tenant: str) -> str:
    return console.state.audit.tenant_digest(tenant)[:12]


def _metrics_label(console, tenant: str) -> str:
    """The tenant's label in /metrics (and so in the tenants view): its name where its policy data
    allows names in metrics (Gamma's does), else its digest."""
    data = json.loads((Path(__file__).parents[1] / "api" / "data" / "tenants.json").read_text())["tenants"][tenant]
    return data["name"] if data["logging"].get("name_in_metrics") else _digest(console, tenant)


def _operator_token(console, *roles: str) -> str:
    """A token from `tenantgate token`, as an operator mints one in development."""
    args = [TENANTGATE, "token", "--tenant", PLATFORM, "--audience", AUDIENCE, "--issuer", console.dev_issuer_url]
    for role in roles:
        args += ["--role", role]
    if not roles:
        args += ["--scope", "Inference.Invoke"]
    done = subprocess.run(args, env=gateway_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _rows(driver, table: str, key: str) -> dict[str, dict[str, str]]:
    from selenium.webdriver.common.by import By

    rows = {}
    for row in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-{key}]"):
        cells = row.find_elements(By.CSS_SELECTOR, "td[data-field]")
        rows[row.get_attribute(f"data-{key}")] = {cell.get_attribute("data-field"): cell.text for cell in cells}
    return rows


def _text(driver, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text


def _runs(steps) -> list[tuple[str, int, int, int]]:
    """(regime, first step, last step, steps) of each run of equal regime, newest first."""
    runs = []
    for regime, group in itertools.groupby(steps, key=lambda s: s.regime):
        numbers = [s.step for s in group]
        runs.append((regime, numbers[0], numbers[-1], len(numbers)))
    return runs[::-1]


@pytest.fixture(scope="module")
def browser(console, tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A signed-in chromium, and where its screenshots go."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    shots = artifacts_dir(tmp_path_factory.mktemp("console-screenshots"))
    print(f"\nconsole screenshots: {shots}")
    with chromium() as driver:
        driver.get(console.operator_url + "/console")
        assert "Sign in" in driver.title  # no session: the login page (the status is 401, checked below)
        full_page_screenshot(driver, shots / "console-login.png")
        driver.find_element(By.ID, "token").send_keys(_operator_token(console, OPERATOR_ROLE))
        driver.find_element(By.ID, "sign-in").click()
        signed_in_or_refused = (By.CSS_SELECTOR, "#generated, #message")
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(*signed_in_or_refused))
        assert driver.current_url == console.operator_url + "/console", driver.page_source[:500]
        yield SimpleNamespace(driver=driver, shots=shots)


def _open(browser, console, view: str) -> object:
    driver = browser.driver
    driver.get(f"{console.operator_url}/console" + ("" if view == "overview" else f"/{view}"))
    assert driver.find_element("id", "generated").text  # a console page, not the login page
    full_page_screenshot(browser.driver, browser.shots / f"console-{view}.png")
    source = driver.page_source
    for secret in (CANARY, ALPHA, GAMMA, BETA, EPSILON, "mountain", "harbours"):  # no prompt text, no tenant id
        assert secret not in source, f"{secret!r} is on the {view} page"
    return driver


def test_the_run_went_as_planned(console) -> None:
    statuses = {tenant: [status for status, _ in answers] for tenant, answers in console.answers.items()}
    assert statuses == {ALPHA: [200] * 7, GAMMA: [200] * 3, BETA: [404, 404], EPSILON: [200, 200, 429]}


def test_the_overview_shows_every_view(console, browser) -> None:
    driver = _open(browser, console, "overview")
    for view in VIEWS:
        assert driver.find_element("id", f"view-{view}").is_displayed()


def test_tenants_and_their_decisions_match_metrics_and_the_trail(console, browser) -> None:
    shown = _rows(_open(browser, console, "tenants"), "tenants", "tenant")
    told = {_metrics_label(console, t): Counter(allowed=statuses.count(200), denied=statuses.count(404),
                                         throttled=statuses.count(429))
            for t, statuses in ((t, [s for s, _ in a]) for t, a in console.answers.items())}
    by_metrics = defaultdict(Counter)
    for sample in _scrape(console)["tenantgate_requests"]:
        labels = sample.labels
        if labels["tenant"] != "none" and sample.name.endswith("_total"):
            outcome = ("throttled" if labels["status"] == "429" else "denied" if labels["decision"] == "deny"
                       else "allowed" if labels["status"] == "200" else "other")
            by_metrics[labels["tenant"]][outcome] += int(sample.value)
    by_trail = defaultdict(Counter)
    labels_by_digest = {_digest(console, t): _metrics_label(console, t) for t in console.answers}
    for record in _records(console):
        outcome = ("throttled" if record["status"] == 429 else "denied" if not record["decision"]["allow"]
                   else "allowed" if record["status"] == 200 else "other")
        by_trail[labels_by_digest[record["tenant"][:12]]][outcome] += 1
    as_shown = {tenant: Counter({k: int(v) for k, v in row.items() if k != "total" and int(v)})
                for tenant, row in shown.items()}
    assert as_shown == told == dict(by_metrics) == dict(by_trail)
    assert all(int(row["total"]) == sum(as_shown[tenant].values()) for tenant, row in shown.items())


def test_quota_headroom_is_what_each_tenants_last_caller_was_told(console, browser) -> None:
    shown = _rows(_open(browser, console, "quotas"), "quotas", "tenant")
    assert set(shown) == {_digest(console, t) for t in (ALPHA, GAMMA, EPSILON)}  # Beta never reached the store
    for tenant in (ALPHA, GAMMA, EPSILON):
        status, headers = console.answers[tenant][-1]
        row = shown[_digest(console, tenant)]
        assert row["remaining_requests"] == headers["x-ratelimit-remaining-requests"]
        assert row["remaining_tokens"] == headers["x-ratelimit-remaining-tokens"]
        assert row["requests_per_minute"] == headers["x-ratelimit-limit-requests"]
        assert row["admitted"] == ("refused" if status == 429 else "admitted")
    assert shown[_digest(console, EPSILON)]["remaining_requests"] == "0"


def test_kv_use_and_evictions_by_tenant_match_the_step_records(console, browser) -> None:
    driver = _open(browser, console, "kv")
    shown = _rows(driver, "kv", "tenant")
    steps = console.sink.steps
    engine_tags = {_engine_tag(console, t): _digest(console, t) for t in (ALPHA, GAMMA, EPSILON)}
    evicted = Counter()
    for step in steps:
        evicted.update(dict(step.kv_evicted))
    expected = {}
    for tag, held, cached, share in steps[-1].kv_tenants:
        expected[engine_tags[tag]] = {"held": str(held), "cached": str(cached), "share": str(share),
                                      "evicted": str(evicted.get(tag, 0))}
    for tag, blocks in evicted.items():
        expected.setdefault(engine_tags[tag], {"held": "0", "cached": "0", "share": "0"})["evicted"] = str(blocks)
    assert shown == expected
    assert sum(evicted.values()) > 0 and int(shown[_digest(console, ALPHA)]["evicted"]) > 0  # the pool was too small
    pool = {s.labels["state"]: int(s.value) for s in _scrape(console)["tenantgate_kv_blocks"]}
    for state, blocks in pool.items():
        assert _text(driver, f'#view-kv [data-state="{state}"]') == f"{state} {blocks}"
    assert _text(driver, "#kv-step") == str(steps[-1].step)


def _engine_tag(console, tenant: str) -> str:
    from engine import tenant_digest
    from gateway.pipeline.envelope import isolation_key

    return tenant_digest(isolation_key(console.settings.namespace_key, tenant))


def test_prefix_hits_by_scope_match_metrics_and_the_trail(console, browser) -> None:
    shown = _rows(_open(browser, console, "prefix"), "prefix", "scope")
    scraped = _scrape(console)
    hits = {s.labels["scope"]: int(s.value) for s in scraped["tenantgate_prefix_cache_hit_tokens"]
            if s.name.endswith("_total")}
    queried = {s.labels["scope"]: int(s.value) for s in scraped["tenantgate_prefix_cache_query_tokens"]
               if s.name.endswith("_total")}
    trail_hits, trail_queried = Counter(), Counter()
    for record in _records(console):
        if "engine" in record:
            trail_hits[record["engine"]["cache_scope"]] += record["engine"]["cached_tokens"]
            trail_queried[record["engine"]["cache_scope"]] += record["engine"]["prompt_tokens"]
    assert {scope: int(row["hit_tokens"]) for scope, row in shown.items()} == hits == dict(trail_hits)
    assert {scope: int(row["query_tokens"]) for scope, row in shown.items()} == queried == dict(trail_queried)
    assert hits["shared"] > 0 and hits["tenant"] > 0, hits  # Gamma's repeats, and Alpha's
    for scope, row in shown.items():
        assert row["hit_rate"] == f"{hits[scope] / queried[scope] * 100:.1f} %"


def test_the_regime_timeline_is_the_engines_step_records(console, browser) -> None:
    driver = _open(browser, console, "regimes")
    shown = _rows(driver, "regimes", "first-step")
    expected = _runs(console.sink.steps)[:60]
    runs = [(r["regime"], int(r["first_step"]), int(r["last_step"]), int(r["steps"])) for r in shown.values()]
    assert runs == expected and len(runs) > 1  # isolation_strict (tenant lanes) and normal (shared) both ran
    by_regime = Counter()
    for sample in _scrape(console)["tenantgate_steps"]:
        if sample.name.endswith("_total"):
            by_regime[sample.labels["regime"]] += int(sample.value)
    for regime in ("normal", "memory_pressured", "queue_degraded", "isolation_strict"):
        assert _text(driver, f'#view-regimes p [data-regime="{regime}"]') == f"{regime} {by_regime[regime]}"
    assert sum(by_regime.values()) == len(console.sink.steps)


def test_the_audit_chain_status_is_the_verifiers(console, browser) -> None:
    driver = _open(browser, console, "audit")
    key = load_or_create_signing_key(console.settings.audit_signing_key).public_key()
    report = verify_files([console.settings.audit_file], key)
    assert _text(driver, "#audit-verdict") == report.verdict == "ok"
    shown = {cell.get_attribute("data-field"): cell.text for cell in driver.find_elements("css selector", "#audit td")}
    assert int(shown["records"]) == report.records and int(shown["chains"]) == report.chains == 1
    assert shown["sink_errors"] == "0"


def test_the_live_policy_revision_is_the_one_that_judged(console, browser) -> None:
    driver = _open(browser, console, "policy")
    revisions = {s.labels["revision"] for s in _scrape(console)["tenantgate_policy_info"] if s.value == 1}
    judged = {record["policy_revision"] for record in _records(console)}
    assert len(revisions) == 1 and judged == revisions
    assert _text(driver, '#policy [data-field="revision"]') == revisions.pop()
    assert _text(driver, '#policy [data-field="last_judged_revision"]') == judged.pop()
    assert _text(driver, '#policy [data-field="reload_failures"]') == "0"


def test_a_tampered_trail_shows_as_tampered(console, browser) -> None:
    # Last in this module: it edits the live trail. One record's completion tokens, lowered.
    path: Path = console.settings.audit_file
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if '"route":"chat.completions"' in line and '"status":200' in line)
    lines[index] = lines[index].replace('"status":200', '"status":201', 1)
    path.write_text("\n".join(lines) + "\n")
    driver = _open(browser, console, "audit")
    full_page_screenshot(driver, browser.shots / "console-audit-tampered.png")
    assert _text(driver, "#audit-verdict") == "tampered"
    assert "altered" in _text(driver, "#audit-reason")
