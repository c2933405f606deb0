"""`sidecar observations`: read a running sidecar's admin endpoint and print the windows."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from sidecar.commands.text_table import format_table

_COLUMNS = ("count", "p95_latency_ms", "p95_ttfb_ms", "p95_ms_per_output_token",
            "output_tokens_per_s", "error_rate", "timeout_rate", "fallback_rate")


def fetch_observations(admin_http: str, window: int | None,
                       token: str | None = None) -> dict[str, Any]:
    url = f"http://{admin_http}/observations" + (f"?window={window}" if window else "")
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except OSError as exc:
        raise OSError(f"cannot reach the sidecar admin endpoint at {admin_http}: {exc}") from None


def render_table(document: dict[str, Any]) -> str:
    lines = [f"window: {document['window_seconds']} s"]
    targets = document.get("targets", {})
    if not targets:
        return lines[0] + "\nno observations yet"
    rows = [["target", *_COLUMNS, "outcomes"]]
    for name, figures in targets.items():
        cells = [name]
        for column in _COLUMNS:
            value = figures.get(column)
            cells.append("-" if value is None else
                         f"{value:.3f}" if isinstance(value, float) else str(value))
        outcomes = figures.get("outcomes", {})
        cells.append(" ".join(f"{k}={v}" for k, v in sorted(outcomes.items())) or "-")
        rows.append(cells)
    return "\n".join([*lines, format_table(rows)])
