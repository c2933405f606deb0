"""Issue 43: the operator console through the real stack (`sidecar up`: Envoy from the wheel,
the sidecar, the demo providers), rendered in headless Chromium.

- The demo as README starts it, with its traffic and its drift brought forward: within
  the first minute the console shows the drifting target ejected, the others taking its
  share, conversations pinned and costs by complexity; the screenshots are read (the
  charts' colours counted), and, with SIDECAR_CONSOLE_SCREENSHOTS=<folder>, kept for
  README's tour.
- A quiet demo given a known set of requests: every figure the pages show equals what
  `sidecar observations` (and `/observations`), `/metrics` and `sidecar report` say at
  the same moment.
The token rule and the secret search over every page run in tests/e2e/test_canary.py (its
stack has an admin token and the canaries); the rest of the rules in
tests/unit/console/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from PIL import Image

from sidecar.devstack.harness import UpProcess
from tests.chromium import rendered_dom, screenshot

pytestmark = pytest.mark.e2e

TOKEN = "demo-caller-token"
# Light theme series colours (console.css --s0, --s1): the charts' first two series.
BLUE, ORANGE = (0x09, 0x69, 0xDA), (0xD4, 0x64, 0x0C)


class Tables(HTMLParser):
    """Every table of a page, by caption: its rows as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._caption: str | None = None
        self._rows: list[list[str]] | None = None
        self._cell: list[str] | None = None
        self._in_caption = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self._rows, self._caption = [], ""
        elif tag == "caption":
            self._in_caption = True
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption":
            self._in_caption = False
        elif tag in ("td", "th") and self._cell is not None and self._rows:
            self._rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table" and self._rows is not None:
            self.tables[self._caption or f"table {len(self.tables)}"] = self._rows
            self._rows = None

    def handle_data(self, data: str) -> None:
        if self._in_caption:
            self._caption = (self._caption or "") + data
        elif self._cell is not None:
            self._cell.append(data)


def tables(dom: str) -> dict[str, list[list[str]]]:
    parser = Tables()
    parser.feed(dom)
    return parser.tables


def figure(text: str) -> float | None:
    """A cell's number: `1,348 ms` → 1348, `7.6 %` → 7.6, `$0.000120` → 0.00012."""
    if text in ("–", ""):
        return None
    return float(re.sub(r"[^0-9.\-]", "", text))


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def keep(image: Path, name: str) -> None:
    folder = os.environ.get("SIDECAR_CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, Path(folder) / name)


def colour_count(image: Path, rgb: tuple[int, int, int]) -> int:
    colours = Image.open(image).convert("RGB").getcolors(maxcolors=1 << 22) or []
    return sum(n for n, colour in colours if colour == rgb)


def test_the_demo_shows_the_router_at_work_within_the_first_minute(tmp_path: Path) -> None:
    up = UpProcess(["--demo-port", "0", "--demo-drift-after", "2", "--demo-traffic-rate", "10"],
                   env={"XDG_STATE_HOME": str(tmp_path / "state")},
                   log_path=tmp_path / "up.log")
    with up.running():
        console = up.banner_value(r"console: (http://\S+/console/)")
        admin = console.removesuffix("/console/")
        deadline = time.monotonic() + 90
        ejected = None
        while time.monotonic() < deadline:
            ejected = metric(httpx.get(f"{admin}/metrics", timeout=10).text,
                             "sidecar_ejected_targets", group="adaptive-agent")
            if ejected:
                break
            time.sleep(1)
        assert ejected == 1.0, "the drifting target was not ejected within 90 s"
        time.sleep(3)  # a few more decisions without it

        now = rendered_dom(console + "now")
        targets = tables(now)["adaptive-agent: targets now (figures over the last 600 s)"]
        rows = {row[0]: row for row in targets[1:]}
        assert "ejected" in rows["baseten/gpt-oss-120b"][1], rows
        assert figure(rows["baseten/gpt-oss-120b"][10]) > 0  # its errors are on show
        assert "in" in rows["minimax/m3"][1]
        pinned = re.search(r"(\d+) conversations pinned", now)
        assert pinned and int(pinned.group(1)) > 0
        assert "Why traffic goes where it goes" in now and "thresholds.ejected" in now
        shot = screenshot(console + "now", tmp_path / "now.png", 1280, 1500)
        assert colour_count(shot, BLUE) > 300 and colour_count(shot, ORANGE) > 300
        keep(shot, "console-now.png")

        decisions = rendered_dom(console + "decisions?group=adaptive-agent")
        assert re.search(r"the last \d+ decisions of this replica", decisions)
        assert "fallback" in decisions or "failed" in decisions
        detail = re.search(r'href="(/console/decisions/[^"]+)"', decisions).group(1)
        explained = rendered_dom(admin + detail)
        assert "candidates" in explained and "policy version" in explained
        keep(screenshot(console + "decisions", tmp_path / "decisions.png", 1280, 900),
             "console-decisions.png")

        time.sleep(2)  # the telemetry worker's rows
        usage = rendered_dom(console + "usage?period=15m")
        by_complexity = tables(usage)["usage by complexity"]
        cost_per_request = {row[0]: figure(row[8]) for row in by_complexity[1:]}
        assert {"simple", "complex"} <= set(cost_per_request), by_complexity
        assert cost_per_request["complex"] > cost_per_request["simple"]
        shot = screenshot(console + "usage?period=15m", tmp_path / "usage.png", 1280, 1200)
        assert colour_count(shot, BLUE) > 200  # the series are drawn
        keep(shot, "console-usage.png")
        errors = rendered_dom(console + "errors?period=15m")
        assert "server_error" in errors and "<polyline" in errors


def test_the_pages_say_what_metrics_observations_and_report_say(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = UpProcess(["--demo-port", "0", "--no-demo-traffic"],
                   env={"XDG_STATE_HOME": str(state)}, log_path=tmp_path / "up.log")
    with up.running():
        console = up.banner_value(r"console: (http://\S+/console/)")
        admin = console.removesuffix("/console/")
        oai = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        for n in range(20):
            content = ("Fix this:\n```python\nx = {}\nx['id']\n```\nTraceback (most recent "
                       "call last):\nKeyError: 'id'" if n % 3 == 0 else f"hello {n}")
            oai.chat.completions.create(model="adaptive-agent",
                                        messages=[{"role": "user", "content": content}],
                                        stream=n % 2 == 0)
        claude = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
        for _ in range(4):
            claude.messages.create(model="claude-agent", max_tokens=32,
                                   messages=[{"role": "user", "content": "hi"}])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = httpx.get(f"{admin}/reports/usage?since=1h", timeout=10).json()["rows"]
            if sum(r["requests"] for r in rows) == 24:
                break
            time.sleep(0.2)
        # Nothing moves from here on: every source read at the same moment.
        observed = json.loads(subprocess.run(  # what `sidecar observations` prints
            [sys.executable, "-m", "sidecar", "observations", "--admin-http",
             admin.removeprefix("http://"), "--window", "600", "--format", "json"],
            capture_output=True, text=True, timeout=60, check=True).stdout)["targets"]
        assert observed == httpx.get(f"{admin}/observations?window=600",
                                     timeout=10).json()["targets"]
        metrics = httpx.get(f"{admin}/metrics", timeout=10).text
        db = state / "model-group-sidecar" / "demo-telemetry.db"
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "sidecar", "report", "usage", "--db", str(db), "--since",
             "1h", "--format", "json"], capture_output=True, text=True, timeout=60,
            check=True).stdout)["rows"]

        now = tables(rendered_dom(console + "now"))
        shown = {row[0]: row for caption, rows in now.items() if "targets now" in caption
                 for row in rows[1:]}
        assert set(observed) <= set(shown)
        for target, row in shown.items():
            figures = observed.get(target, {"count": 0, "p95_latency_ms": None,
                                            "error_rate": 0.0})
            if target not in observed:  # never served: no figures anywhere
                assert figure(row[5]) == 0 and metric(
                    metrics, "sidecar_target_observations", target=target) is None
                continue
            assert figure(row[5]) == figures["count"] == metric(
                metrics, "sidecar_target_observations", target=target), target
            assert figure(row[6]) == (None if figures["p95_latency_ms"] is None
                                      else round(figures["p95_latency_ms"])), target
            assert figure(row[10]) == round(figures["error_rate"] * 100, 1), target
        decisions = rendered_dom(console + "decisions")
        assert "the last 24 decisions of this replica" in decisions and "served 24" in decisions
        # The page's script ran under the policy (a blocked script would leave no button).
        assert 'id="pause"' in decisions and "live, every 5 s" in decisions
        usage = tables(rendered_dom(console + "usage?period=1h"))["usage by target"]
        on_page = {row[0]: row for row in usage[1:]}
        assert set(on_page) == {r["target"] for r in report}
        for row in report:
            cells = on_page[row["target"]]
            assert figure(cells[1]) == row["requests"]
            assert figure(cells[4]) == row["input_tokens"]
            assert figure(cells[5]) == row["output_tokens"]
            assert figure(cells[7]) == pytest.approx(row["cost_usd"], rel=1e-3, abs=1e-6)
        # Light and dark, as the system prefers: the page's background is the theme's.
        for dark, background in ((False, (0xFF, 0xFF, 0xFF)), (True, (0x0D, 0x11, 0x17))):
            shot = screenshot(console + "now", tmp_path / f"now-{dark}.png", 1000, 700, dark)
            colours = sorted(Image.open(shot).convert("RGB").getcolors(1 << 22), reverse=True)
            assert colours[0][1] == background, (dark, colours[:3])
        csv = httpx.get(f"{console}usage.csv?view=target&period=1h", timeout=10)
        assert csv.status_code == 200 and csv.text.splitlines()[0].startswith("target,requests")
        assert len(csv.text.strip().splitlines()) == 1 + len(report)
