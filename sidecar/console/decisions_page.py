"""The console's Decisions page: the recent decisions of this replica (console/
decision_ring.py), filtered by group, caller, target and outcome, and each one's explain
view, rendered from the same trace `sidecar explain` prints (routing/trace.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from sidecar.console.decision_ring import OUTCOMES, RecentDecision
from sidecar.console.html import (
    badge,
    clock,
    esc,
    link,
    moment,
    number,
    options,
    percent,
    table,
)

SHOWN = 200  # rows on the page; the ring holds more, the filters reach them all
_OUTCOME_BADGE = {"served": "good", "fallback": "warn", "hedged": "info", "cancelled": "info",
                  "failed": "bad", "refused": "bad", "pending": "info"}


@dataclass(frozen=True)
class DecisionFilters:
    group: str | None = None
    caller: str | None = None
    target: str | None = None
    outcome: str | None = None

    @classmethod
    def from_query(cls, values: Mapping[str, list[str]]) -> DecisionFilters:
        def one(key: str) -> str | None:
            given = values.get(key)
            return given[0][:256] if given and given[0] else None
        outcome = one("outcome")
        return cls(one("group"), one("caller"), one("target"),
                   outcome if outcome in OUTCOMES else None)

    def keeps(self, entry: RecentDecision) -> bool:
        return ((self.group is None or entry.group == self.group)
                and (self.caller is None or entry.caller == self.caller)
                and (self.target is None or self.target in (entry.primary, entry.served_by))
                and (self.outcome is None or entry.outcome == self.outcome))


def render_list(recent: list[RecentDecision], filters: DecisionFilters, held: int) -> str:
    groups = sorted({e.group for e in recent})
    callers = sorted({e.caller for e in recent})
    targets = sorted({t for e in recent for t in (e.primary, e.served_by) if t})
    form = ('<form class="filters" method="get" action="/console/decisions">'
            + options("group", "group", groups, filters.group)
            + options("caller", "caller", callers, filters.caller)
            + options("target", "target", targets, filters.target)
            + options("outcome", "outcome", OUTCOMES, filters.outcome)
            + '<button type="submit">filter</button></form>')
    kept = [e for e in recent if filters.keeps(e)]
    rows = []
    for entry in kept[:SHOWN]:
        outcome = entry.outcome
        rows.append([
            link(decision_path(entry.request_id), clock(entry.at)),
            esc(entry.group), esc(entry.caller), esc(entry.trace.canary or ""),
            esc(entry.primary or "–"), esc(entry.served_by or "–"),
            badge(outcome, _OUTCOME_BADGE[outcome]), esc(entry.trace.complexity or "–"),
            esc(_why_primary(entry)), esc(entry.trace.affinity),
            esc(number(entry.latency_ms, 0, " ms")), esc(number(entry.ttfb_ms, 0, " ms"))])
    counts = {o: sum(1 for e in kept if e.outcome == o) for o in OUTCOMES}
    summary = " · ".join(f"{esc(o)} {esc(n)}" for o, n in counts.items() if n)
    return ("<h1>Decisions</h1>"
            f'<p class="note">the last {esc(held)} decisions of this replica, newest first '
            f"(no request text is kept); {esc(len(kept))} match"
            + (f": {summary}" if summary else "") + "</p>" + form
            + table(["decided", "group", "caller", "canary side", "primary", "served by",
                     "outcome", "complexity", "why the primary", "affinity", "latency",
                     "first byte"], rows, caption="recent decisions", numeric_from=10,
                    raw=True, css="decisions"))


def decision_path(request_id: str) -> str:
    """The explain view's address: the id quoted whole (a caller may send its own
    `x-request-id`, with `/`, `?` or `%` in it)."""
    return "/console/decisions/" + quote(request_id, safe="")


def _why_primary(entry: RecentDecision) -> str:
    if entry.primary is None:
        return "no target could serve"
    selection = entry.trace.selection
    if selection is None:
        return entry.trace.order or "–"
    probability, reason = selection
    return f"{reason} ({percent(probability, 0)})"


def render_detail(entry: RecentDecision | None, request_id: str) -> str:
    if entry is None:
        return ("<h1>Decision</h1><p class=\"note\">no decision "
                f"<code>{esc(request_id[:80])}</code> in this replica's ring (it keeps the "
                "most recent only; `sidecar report` reads older ones from telemetry)</p>"
                + link("/console/decisions", "back to the decisions"))
    trace = entry.trace.to_dict()
    facts = [("request id", entry.request_id), ("decided", moment(entry.at)),
             ("group", entry.group), ("caller", entry.caller),
             ("strategy", trace["strategy"]), ("policy version", trace["policy_version"]),
             ("canary side", trace.get("canary") or "–"),
             ("primary", entry.primary or f"none: {entry.refusal}"),
             ("served by", entry.served_by or "–"), ("outcome", entry.outcome),
             ("status", number(entry.status)), ("attempts", number(entry.attempts)),
             ("latency", number(entry.latency_ms, 0, " ms")),
             ("first byte", number(entry.ttfb_ms, 0, " ms")),
             ("complexity", trace["complexity"] or "–"),
             ("score terms", ", ".join(trace["score_terms"]) or "–"),
             ("order", trace["order"] or "–"), ("cold start", trace["cold_start"] or "–"),
             ("affinity", trace["affinity"]), ("probe", trace["probe"] or "–"),
             ("selection", _why_primary(entry)),
             ("signals", ", ".join(trace["signals"]) or "–"),
             ("prompt features", ", ".join(trace["prompt_features"]) or "–"),
             ("request shape", ", ".join(f"{k}={v}" for k, v in
                                         sorted(trace["request_shape"].items())) or "–")]
    if trace.get("external") is not None:
        facts.append(("routing service", trace["external"]))
    if trace["require_tags_relaxed"] or trace["thresholds_relaxed"]:
        facts.append(("relaxed", ", ".join(
            name for name in ("require_tags", "thresholds") if trace[f"{name}_relaxed"])))
    listing = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    odds = {o["target"]: o["probability"] for o in trace["odds"]}
    score_names = sorted({name for c in trace["candidates"] for name in c["scores"]})
    candidates = table(
        ["candidate", "weight share", "state", "observations", *score_names, "term value",
         "blend share", "odds"],
        [[c["target"], percent(c["weight_share"]), "warm" if c["warm"] else "cold",
          number(c["observations"]), *(number(c["scores"].get(n), 3) for n in score_names),
          number(c["term_value"], 3), percent(c["final_share"]), percent(odds.get(c["target"]))]
         for c in trace["candidates"]], caption="candidates", numeric_from=1)
    exclusions = table(["target", "excluded by"],
                       [[x["target"], x["stage"]] for x in trace["exclusions"]]
                       + [[u["target"], f"unproven: {u['threshold']}"] for u in trace["unproven"]],
                       caption="exclusions (rule names)")
    attempts = table(["failed attempt", "error class", "then"],
                     [[a, b, c] for a, b, c in entry.failed_attempts],
                     caption="fallback attempts")
    return (f"<h1>Decision {esc(clock(entry.at))}</h1>"
            + link("/console/decisions", "back to the decisions")
            + f'<dl class="facts-list">{listing}</dl>' + candidates + exclusions + attempts)
