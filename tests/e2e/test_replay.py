"""`sidecar replay` on a log made by real traffic (issue #31): requests through real Envoy
and the sidecar with the openai SDK, one row each in SQLite, then the command re-decides
them under candidate configurations. Replaying the logging configuration changes no
decision and finds the logged figures; a candidate that prefers the slow target estimates
a higher latency; the HTML report renders in headless Chromium and shows its charts."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PIL import Image

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider
from tests.chromium import rendered_dom, screenshot

pytestmark = pytest.mark.e2e

TOKEN = "replay-caller-token"
KEYS = {"fast": "key-fast", "slow": "key-slow"}
CONFIG = """\
providers:
  fast: {{base_url: '{fast}', credential: {{env: KEY_FAST}}}}
  slow: {{base_url: '{slow}', credential: {{env: KEY_SLOW}}}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  mix:
    strategy: weighted
    targets:
      - {{provider: fast, model_ref: f, weight: {fast_weight},
         pricing: {{input_per_mtok: 3, output_per_mtok: 15}}}}
      - {{provider: slow, model_ref: s, weight: {slow_weight},
         pricing: {{input_per_mtok: 1, output_per_mtok: 4}}}}
"""
REQUESTS = 60


def config_text(providers, db: Path, fast_weight: int = 1, slow_weight: int = 1) -> str:
    return CONFIG.format(fast=providers.base_url("fast"), slow=providers.base_url("slow"),
                         db=db, digest=hashlib.sha256(TOKEN.encode()).hexdigest(),
                         fast_weight=fast_weight, slow_weight=slow_weight)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """A window of real traffic: (the database, the workdir, the candidate template)."""
    workdir = tmp_path_factory.mktemp("replay")
    db = workdir / "telemetry.db"
    fakes = [FakeProvider("fast", api_key=KEYS["fast"]),
             FakeProvider("slow", api_key=KEYS["slow"],
                          behaviour=Behaviour(latency_s=0.15))]
    with keyed_stack(workdir, fakes, lambda providers: config_text(providers, db), KEYS,
                     ) as (up, providers):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        for n in range(REQUESTS):
            client.chat.completions.create(
                model="mix", messages=[{"role": "user", "content": f"question {n}"}])
        wait_for_rows(db, REQUESTS)
        template = config_text(providers, db, fast_weight=1, slow_weight=1)
        yield db, workdir, template.replace("weight: 1,", "weight: {w},", 1)


def wait_for_rows(db: Path, expected: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            if conn.execute("SELECT count(*) FROM request_rows").fetchone()[0] >= expected:
                return
        time.sleep(0.05)
    raise AssertionError("rows did not arrive")


def run_replay(config: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "replay", "--config", str(config), "--db", str(db),
         "--since", "1h", *args], capture_output=True, text=True, timeout=120,
        env={"KEY_FAST": "x", "KEY_SLOW": "y", "PATH": "/usr/bin:/bin"})


def candidate(workdir: Path, template: str, fast_weight: int, name: str) -> Path:
    path = workdir / name
    path.write_text(template.replace("{w}", str(fast_weight)))
    return path


def test_replaying_the_logging_configuration_finds_what_was_logged(logged) -> None:
    db, workdir, template = logged
    same = candidate(workdir, template, 1, "same.yaml")
    result = run_replay(same, db, "--format", "json", "--no-progress")
    assert result.returncode == 0, result.stderr
    [group] = json.loads(result.stdout)["groups"]
    assert group["group"] == "mix" and group["evaluated"] == REQUESTS
    assert group["not_evaluated"] == {}
    assert group["decisions_changed"] == 0.0
    assert list(group["logged_policy_versions"]) == [group["candidate_policy_version"]]
    latency = group["estimates"]["latency_ms"]
    assert latency["ips"]["value"] == pytest.approx(latency["logged"]["value"])
    assert latency["delta"]["low"] <= 0 <= latency["delta"]["high"]
    assert group["target_shares"]["logged"] == {"fast/f": 0.5, "slow/s": 0.5}


def test_a_candidate_preferring_the_slow_target_is_estimated_slower_and_cheaper(logged) -> None:
    db, workdir, template = logged
    slower = candidate(workdir, template, 0, "slower.yaml")  # fast weight 0: all slow
    result = run_replay(slower, db, "--format", "json", "--progress")
    assert result.returncode == 0, result.stderr
    assert f"{REQUESTS} / {REQUESTS} rows" in result.stderr  # the progress bar ran to its end
    [group] = json.loads(result.stdout)["groups"]
    assert group["decisions_changed"] == pytest.approx(0.5)
    assert group["target_shares"]["candidate"]["slow/s"] == pytest.approx(1.0)
    latency = group["estimates"]["latency_ms"]
    assert latency["delta"]["low"] > 50  # the slow target answers 150 ms later
    cost = group["estimates"]["cost_usd"]
    assert cost["delta"]["high"] < 0
    table = run_replay(slower, db, "--no-progress")
    assert "decisions that change: 50.0%" in table.stdout
    assert "latency_ms" in table.stdout and "candidate (DR)" in table.stdout


def test_the_html_report_renders_in_a_browser_with_its_charts(logged, tmp_path) -> None:
    db, workdir, template = logged
    slower = candidate(workdir, template, 0, "slower-html.yaml")
    page = tmp_path / "replay.html"
    result = run_replay(slower, db, "--format", "html", "--out", str(page), "--no-progress")
    assert result.returncode == 0, result.stderr
    dom = rendered_dom(page)
    assert 'data-group="mix"' in dom and "Counterfactual replay" in dom
    for chart in ("cost_usd", "latency_ms", "error_rate", "target_shares"):
        assert f'data-chart="{chart}"' in dom
    assert dom.count('data-series="candidate"') >= 6 and "50.0%" in dom
    image = Image.open(screenshot(page, tmp_path / "replay.png")).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    blue = sum(n for n, (r, g, b) in colours if (r, g, b) == (0x25, 0x63, 0xEB))
    grey = sum(n for n, (r, g, b) in colours if (r, g, b) == (0x6B, 0x72, 0x80))
    assert blue > 500 and grey > 500  # the candidate's and the logged series are drawn


def test_the_console_lists_the_reports_of_its_folder(logged, tmp_path) -> None:
    """Issue 43: a folder given with --replay-reports: the errors page lists each report's
    groups with their headline figures (read from the JSON replay wrote), and says what it
    cannot read instead of failing."""
    from sidecar.console.replay_reports import MAX_BYTES, read_reports, render

    db, workdir, template = logged
    folder = tmp_path / "replays"
    folder.mkdir()
    slower = candidate(workdir, template, 0, "slower-console.yaml")
    result = run_replay(slower, db, "--format", "json", "--out", str(folder / "slower.json"),
                        "--no-progress")
    assert result.returncode == 0, result.stderr
    (folder / "broken.json").write_text('{"groups": "no"')
    (folder / "huge.json").write_bytes(b" " * (MAX_BYTES + 1))
    (folder / "notes.txt").write_text("not a report")
    reports = {report.name: report for report in read_reports(folder)}
    assert set(reports) == {"slower.json", "broken.json", "huge.json"}
    assert reports["broken.json"].problem and reports["huge.json"].problem
    [group] = reports["slower.json"].groups
    page = render(list(reports.values()))
    assert f"<td class=\"num\">{REQUESTS}</td><td class=\"num\">50.0 %</td>" in page
    logged_latency = group["estimates"]["latency_ms"]["logged"]["value"]
    assert f"latency_ms {logged_latency:.4g} → " in page
    assert "not a `sidecar replay --format json` document" in page
    assert "no folder of replay reports" in render(None)
