"""The console's Now page: every group and target's live state, the share each target gets
against its weight, and the score breakdown that produces it.

`gather` runs on the event loop and only copies what the router and the observation store
hold now (the same reads `/observations` and `/metrics` make, so the figures are theirs);
`render` runs on a worker thread and only formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.config.models import ModelGroup, SidecarConfig
from sidecar.console.decision_ring import RecentDecision
from sidecar.console.decisions_page import decision_path
from sidecar.console.html import badge, clock, esc, link, number, percent, table
from sidecar.console.svg import bar_chart
from sidecar.observe.store import ObservationStore
from sidecar.routing.ejection import Health
from sidecar.routing.observations import TargetObservations
from sidecar.routing.router import Router

# The share a target "gets now": of the group's decisions in the last minute.
SHARE_SECONDS = 60


@dataclass(frozen=True)
class TargetNow:
    label: str
    weight: float
    figures: TargetObservations
    outcomes: dict[str, int]
    health: str                   # in, ejected, probing
    ejected_for_s: float | None   # seconds until its ejection ends (ejected only)
    held_for_s: float             # seconds its provider's retry-after still asks to wait


@dataclass(frozen=True)
class GroupNow:
    name: str
    strategy: str
    window_s: int
    min_observations: int | None
    policy_version: str
    targets: list[TargetNow]
    pins: int | None
    canary: str | None
    recent: list[RecentDecision] = field(default_factory=list)


@dataclass(frozen=True)
class NowState:
    at: float
    groups: list[GroupNow]
    fleet: dict[str, float] | None


def gather(config: SidecarConfig, router: Router, store: ObservationStore,
           recent: list[RecentDecision], now: float,
           fleet: dict[str, float] | None) -> NowState:
    """On the event loop: a copy of what the router and the store say now."""
    groups = []
    for name, group in config.models.items():
        window = _window(group, store)
        ejections = router.ejections(name)
        targets = []
        for target in group.targets:
            label = f"{target.provider}/{target.model_ref}"
            summary = store.summary(label, window)
            health, left = Health.IN, None
            if ejections is not None:
                health = ejections.health(label, ejections.now())
                if health is Health.EJECTED:  # until its time is up, or its probe hold
                    left = max(0.0, ejections.ejected_until(label) - ejections.now())
            targets.append(TargetNow(label, float(target.weight), summary.figures,
                                     dict(summary.outcomes), str(health), left,
                                     store.retry_after_s(label)))
        pins = router.affinity_store(name)
        split = router.canary(name)
        canary = None if split is None else (
            f"withdrawn ({split.version})" if split.withdrawn
            else f"serving {split.share * 100:g} % ({split.version})")
        groups.append(GroupNow(
            name, group.strategy, window,
            group.dynamic_score.min_observations if group.strategy == "dynamic_score" else None,
            router.live_version(name), targets, None if pins is None else len(pins), canary,
            [entry for entry in recent if entry.group == name]))
    return NowState(now, groups, fleet)


def _window(group: ModelGroup, store: ObservationStore) -> int:
    if group.strategy == "dynamic_score":
        return min(group.dynamic_score.observation_window_seconds, store.retention_seconds)
    return store.retention_seconds


def render(state: NowState) -> str:
    parts = ["<h1>Now</h1>", _fleet(state.fleet)]
    parts.append('<nav class="toc" aria-label="groups">' + " · ".join(
        f'<a href="#group-{esc(g.name)}">{esc(g.name)}</a>' for g in state.groups) + "</nav>")
    for group in state.groups:
        parts.append(_group(group, state.at))
    return "".join(parts)


def _fleet(fleet: dict[str, float] | None) -> str:
    if fleet is None:
        return '<p class="note">fleet sharing: off (this replica routes on its own figures)</p>'
    up = fleet.get("fleet_up", 0.0) >= 1.0
    age = fleet.get("fleet_merge_age_seconds")
    state = badge("up" if up else "down", "good" if up else "bad")
    if age is not None and age > 1e8:  # no merge yet (its time is the epoch)
        return f'<p class="note">fleet sharing: {state} · no merge yet</p>'
    return (f'<p class="note">fleet sharing: {state}'
            f" · last merge {esc(number(age, 1, ' s'))} ago</p>")


def shares(recent: list[RecentDecision], now: float) -> tuple[int, dict[str, int], dict[str, int]]:
    """The group's decisions of the last minute: how many, and by primary and by who
    served (those that ended)."""
    picked: dict[str, int] = {}
    served: dict[str, int] = {}
    count = 0
    for entry in recent:
        if now - entry.at > SHARE_SECONDS:
            break  # newest first
        if entry.primary is None:
            continue
        count += 1
        picked[entry.primary] = picked.get(entry.primary, 0) + 1
        if entry.served_by:
            served[entry.served_by] = served.get(entry.served_by, 0) + 1
    return count, picked, served


def _group(group: GroupNow, now: float) -> str:
    total_weight = sum(t.weight for t in group.targets) or 1.0
    count, picked, served = shares(group.recent, now)
    facts = [f"strategy <b>{esc(group.strategy)}</b>",
             f"window {esc(group.window_s)} s",
             f"policy <code>{esc(group.policy_version)}</code>"]
    if group.min_observations is not None:
        facts.append(f"warm at {esc(group.min_observations)} observations")
    if group.pins is not None:
        facts.append(f"{esc(group.pins)} conversations pinned")
    if group.canary is not None:
        facts.append(f"canary {esc(group.canary)}")
    rows = []
    bars = []
    for target in group.targets:
        weight_share = target.weight / total_weight
        now_share = picked.get(target.label, 0) / count if count else None
        bars.append((target.label, [weight_share * 100, (now_share or 0.0) * 100]))
        f = target.figures
        rows.append([
            esc(target.label), _state(target, group),
            esc(percent(weight_share)), esc(percent(now_share)),
            esc(percent(served.get(target.label, 0) / count if count else None)),
            esc(number(f.count)), esc(number(f.p95_latency_ms, 0, " ms")),
            esc(number(f.p95_ttfb_ms, 0, " ms")),
            esc(number(f.p95_ms_per_output_token, 1, " ms")),
            esc(number(f.output_tokens_per_s, 1)),
            esc(percent(f.error_rate)), esc(percent(f.timeout_rate)),
            esc(percent(f.fallback_rate))])
    headers = ["target", "state", "weight share", f"routed {SHARE_SECONDS} s",
               f"served {SHARE_SECONDS} s", "observations", "p95 latency", "p95 TTFT",
               "p95 ms/token", "tokens/s", "errors", "timeouts", "fallbacks"]
    name = esc(group.name)
    return (f'<section class="group" id="group-{name}" aria-labelledby="h-{name}">'
            f'<h2 id="h-{esc(group.name)}">{esc(group.name)}</h2>'
            f'<p class="facts">{" · ".join(facts)} · {esc(count)} decisions in the last '
            f"{SHARE_SECONDS} s</p>"
            + table(headers, rows, caption=f"{group.name}: targets now (figures over the "
                    f"last {group.window_s} s)", numeric_from=2, raw=True, css="targets")
            + bar_chart(f"{group.name}: share routed in the last {SHARE_SECONDS} s against "
                        "the configured weight share", bars,
                        ["configured weight share", "routed now"], unit=" %", digits=0)
            + _why(group) + "</section>")


def _state(target: TargetNow, group: GroupNow) -> str:
    parts = []
    if target.health == "ejected":
        parts.append(badge(f"ejected {number(target.ejected_for_s, 0, ' s')} more"
                           if target.ejected_for_s else "ejected (probes held back: the "
                           "group's probe share is spent)", "bad"))
    elif target.health == "probing":
        parts.append(badge("probing", "warn"))
    else:
        parts.append(badge("in", "good"))
    if target.held_for_s > 0:
        parts.append(badge(f"held by retry-after {number(target.held_for_s, 0, ' s')}", "warn"))
    if group.min_observations is not None:
        warm = target.figures.count >= group.min_observations
        parts.append(badge("warm" if warm else "cold", "info" if warm else "warn"))
    return " ".join(parts)


def _why(group: GroupNow) -> str:
    """The latest decision of each complexity class seen: the term that applied, each
    candidate's scores, its term value, its share of the capped blend and its odds."""
    latest: dict[str, RecentDecision] = {}
    for entry in group.recent:
        key = entry.trace.complexity or "any"
        if key not in latest and entry.primary is not None:
            latest[key] = entry
    if not latest:
        return '<p class="note">no decision of this group on this replica yet</p>'
    sections = ['<h3>Why traffic goes where it goes</h3>']
    for complexity, entry in sorted(latest.items()):
        trace = entry.trace
        odds = dict(trace.odds)
        score_names = sorted({name for c in trace.candidates for name in c.scores})
        rows = []
        for candidate in trace.candidates:
            rows.append([candidate.target, "warm" if candidate.warm else "cold",
                         number(candidate.observations),
                         *(number(candidate.scores.get(name), 3) for name in score_names),
                         number(candidate.term_value, 3), percent(candidate.final_share),
                         percent(odds.get(candidate.target))])
        term = ", ".join(trace.score_terms) or "none (weights)"
        out = "; ".join(f"{target} ({stage})" for target, stage in trace.exclusions)
        blend = trace.blend or {}
        cap = blend.get("adjustment")
        sections.append(
            f'<p class="facts">complexity <b>{esc(complexity)}</b> · term <b>{esc(term)}</b>'
            f" · order {esc(trace.order or '–')}"
            + (f" · scores may move {esc(percent(cap, 0))} of the traffic" if cap is not None
               else "")
            + f" · cold start {esc(trace.cold_start or '–')}"
            + (f" · excluded: {esc(out)}" if out else "")
            + f" · last at {esc(clock(entry.at))} · "
            + link(decision_path(entry.request_id), "explain this decision") + "</p>")
        sections.append(table(["candidate", "state", "observations",
                               *(name.removesuffix("_score") for name in score_names),
                               "term value", "blend share", "odds"], rows,
                              caption=f"{group.name}, {complexity}: score breakdown",
                              numeric_from=2, css="scores"))
    return "".join(sections)
