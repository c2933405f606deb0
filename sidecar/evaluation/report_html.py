"""The replay report as one self-contained HTML page: inline CSS and SVG, no script and no
external resource, so it opens from a file, an artifact store or an e-mail alike.

Per group: what was evaluated and why not, how many decisions and pins would change, an
interval chart per figure (the logged policy's mean and the candidate's doubly robust
estimate, each with its interval) and the targets' shares of primaries, logged and
expected under the candidate. Every text is escaped; the page shows only what the JSON
report holds (configuration names, policy versions and numbers)."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Any

_WIDTH, _LEFT, _RIGHT = 640, 150, 24
_COLOURS = {"logged": "#6b7280", "candidate": "#2563eb"}
_TITLES = {"cost_usd": "Cost per request (USD)", "latency_ms": "Latency (ms)",
           "error_rate": "Client-visible error rate"}
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:760px;color:#111}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-top:1px solid #ddd;padding-top:16px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}thead th{border-bottom:1px solid #999}
.note{color:#555}.legend span{display:inline-block;margin-right:16px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
svg text{font:12px system-ui,sans-serif}
"""


def html_page(document: dict[str, Any]) -> str:
    confidence = document["confidence"]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>sidecar replay</title>", f"<style>{_STYLE}</style></head><body>",
             "<h1>Counterfactual replay</h1>",
             f'<p class="note">Window: {_time(document["since"])} to '
             f'{_time(document["until"])}. Estimates from logged outcomes: doubly robust, '
             f'with {confidence:.0%} intervals (docs/policy-evaluation.md).</p>',
             _legend()]
    if not document["groups"]:
        parts.append("<p>No logged requests in that period.</p>")
    for group in document["groups"]:
        parts.append(_group(group, confidence))
    parts.append("</body></html>")
    return "\n".join(parts)


def _legend() -> str:
    return ('<p class="legend">' + "".join(
        f'<span><i class="swatch" style="background:{colour}"></i>{name}</span>'
        for name, colour in _COLOURS.items()) + "</p>")


def _group(group: dict[str, Any], confidence: float) -> str:
    name = escape(group["group"])
    out = [f'<section data-group="{name}"><h2>Group {name}</h2>',
           f'<p>{group["evaluated"]:,} of {group["rows"]:,} logged requests evaluated.']
    if group["not_evaluated"]:
        reasons = ", ".join(f"{escape(k)}: {v:,}" for k, v in group["not_evaluated"].items())
        out.append(f" Not evaluated: {reasons}.")
    out.append("</p>")
    versions = ", ".join(escape(v) for v in group["logged_policy_versions"]) or "-"
    out.append(f'<p class="note">Logged policy {versions}; candidate '
               f'{escape(str(group["candidate_policy_version"]))}.</p>')
    if group["evaluated"]:
        churn = group["affinity_churn"]
        out.append(f'<p>Decisions that change: <b data-figure="decisions_changed">'
                   f'{group["decisions_changed"]:.1%}</b>'
                   + (f'; affinity churn: <b>{churn:.1%}</b> of {group["pinned_turns"]:,} '
                      "pinned turns" if churn is not None else "") + ".</p>")
        if group["candidate_mass_without_support"] > 0.001:
            out.append(f'<p class="note">The candidate puts '
                       f'{group["candidate_mass_without_support"]:.1%} of its probability '
                       "where the logging policy had none for those requests: IPS and SNIPS "
                       "cannot see it; the doubly robust estimate models it.</p>")
        if group["candidate_mass_on_unlogged_targets"] > 0.001:
            out.append(f'<p class="note">The candidate puts '
                       f'{group["candidate_mass_on_unlogged_targets"]:.1%} of its probability on '
                       "targets the log never served: not estimable from it.</p>")
        for figure, found in group["estimates"].items():
            if found is not None:
                out.append(_interval_chart(figure, found, confidence))
        out.append(_share_chart(group["target_shares"]))
    out.append("</section>")
    return "".join(out)


def _interval_chart(figure: str, e: dict[str, Any], confidence: float) -> str:
    rows = [("logged", e["logged"]), ("candidate", e["dr"])]
    values = [v for _, i in rows for v in (i["low"], i["high"], i["value"]) if v is not None]
    low, high = min(*values, 0.0), max(*values, 0.0)
    span = (high - low) or 1.0

    def x(value: float) -> float:
        return _LEFT + (value - low) / span * (_WIDTH - _LEFT - _RIGHT)

    height = 30 * len(rows) + 24
    svg = [f'<svg data-chart="{figure}" width="{_WIDTH}" height="{height}" role="img" '
           f'aria-label="{escape(_TITLES.get(figure, figure))}">']
    for index, (series, interval) in enumerate(rows):
        y = 20 + 30 * index
        value = interval["value"]
        shown = "not estimable" if value is None else _format(figure, value)
        svg.append(f'<text x="4" y="{y + 4}">{series}: {shown}</text>')
        if interval["low"] is not None and interval["high"] is not None:
            svg.append(f'<line data-series="{series}" x1="{x(interval["low"]):.1f}" '
                       f'y1="{y}" x2="{x(interval["high"]):.1f}" y2="{y}" '
                       f'stroke="{_COLOURS[series]}" stroke-width="3"/>')
        if value is not None:
            svg.append(f'<circle data-series="{series}" cx="{x(value):.1f}" cy="{y}" r="6" '
                       f'fill="{_COLOURS[series]}"/>')
    svg.append(f'<text x="{_LEFT}" y="{height - 4}">{_format(figure, low)}</text>')
    svg.append(f'<text x="{_WIDTH - _RIGHT}" y="{height - 4}" text-anchor="end">'
               f"{_format(figure, high)}</text></svg>")
    delta = e["delta"]
    return (f"<h3>{escape(_TITLES.get(figure, figure))}</h3>" + "".join(svg)
            + f'<p class="note">Candidate minus logged: {_format(figure, delta["value"])} '
              f'({confidence:.0%} interval {_format(figure, delta["low"])} to '
              f'{_format(figure, delta["high"])}); IPS {_format(figure, e["ips"]["value"])}, '
              f'SNIPS {_format(figure, e["snips"]["value"])}; {e["n"]:,} requests, effective '
              f'{e["effective_n"]:,.0f}.</p>')


def _share_chart(shares: dict[str, dict[str, float]]) -> str:
    targets = sorted(set(shares["logged"]) | set(shares["candidate"]))
    bar = 12
    height = len(targets) * (2 * bar + 10) + 10
    scale = _WIDTH - _LEFT - _RIGHT - 40  # room for the label after a full bar
    svg = [f'<h3>Share of primaries by target</h3><svg data-chart="target_shares" '
           f'width="{_WIDTH}" height="{height}" role="img" aria-label="target shares">']
    for index, target in enumerate(targets):
        top = 10 + index * (2 * bar + 10)
        svg.append(f'<text x="4" y="{top + bar + 4}">{escape(target)}</text>')
        for offset, series in enumerate(("logged", "candidate")):
            share = shares[series].get(target, 0.0)
            y = top + offset * bar
            svg.append(f'<rect data-series="{series}" data-target="{escape(target)}" '
                       f'x="{_LEFT}" y="{y}" width="{max(1.0, share * scale):.1f}" '
                       f'height="{bar - 2}" fill="{_COLOURS[series]}"/>')
            svg.append(f'<text x="{_LEFT + share * scale + 6:.1f}" y="{y + bar - 3}">'
                       f"{share:.1%}</text>")
    svg.append("</svg>")
    return "".join(svg)


def _format(figure: str, value: float | None) -> str:
    if value is None:
        return "unbounded"
    if value < 0:
        return "−" + _format(figure, -value)
    if figure == "cost_usd":
        return f"${value:.6f}"
    if figure == "latency_ms":
        return f"{value:,.0f} ms"
    return f"{value:.2%}"


def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")
