"""Figures and the Markdown report of the routing-quality benchmark (routing_quality.py).

Requests are attributed to the phase in which they were sent; a target's share is its share
of the upstream attempts the fake providers received (fallbacks and probes included), per
5-second bucket. Definitions, for the degraded target:

- time to drain: from the start of the degradation to the start of the first 5 seconds
  (sliding, in steps of 1 s) in which its share is under 1 % and from which on, to the
  recovery, it is under half its steady share (issue 41: a target with a few percent of
  the traffic has 5 seconds without an attempt by chance, and was counted drained at once
  while it went on serving as before; its figures then measured nothing);
- share after drain: its share of all attempts from then until the recovery, and the
  largest share in any 5 seconds (sliding) of that span;
- time to half share: from the recovery to the end of the first 5 seconds (sliding) in
  which its share is at least half of what it had in the steady phase.

Stickiness: the share of a conversation's follow-up turns served by the target that served
the turn before; also with the forced moves set aside (turns that left the degraded target
during its degradation, when its pins must not hold).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from drift_workload import BY_MODEL, CHAT, DEBUG, DEGRADED, PROFILES, SIMPLE, VALIDATED

BUCKET_S = 5.0
DRAINED = 0.01


@dataclass(frozen=True, slots=True)
class Result:
    kind: str
    ident: int
    turn: int
    at: float           # sent, seconds after the run started
    latency: float      # to the last byte, seconds
    model: str | None   # the serving target's model (None when the request failed)
    prompt_tokens: int
    completion_tokens: int
    error: str | None

    @property
    def cost(self) -> float:
        profile = BY_MODEL.get(self.model or "")
        return profile.cost_usd(self.prompt_tokens, self.completion_tokens) if profile else 0.0


@dataclass(frozen=True, slots=True)
class Attempt:
    at: float
    provider: str


Run = tuple[list[Result], list[Attempt]]


def _phase(at: float, starts: dict[str, float]) -> str:
    current = "warm"
    for name, begin in starts.items():
        if at >= begin:
            current = name
    return current


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _per_1k(results: list[Result], kind: str) -> float:
    served = [r.cost for r in results if r.kind == kind and r.error is None]
    return 1000 * statistics.fmean(served) if served else float("nan")


def stickiness(results: list[Result], starts: dict[str, float]) -> tuple[int, int, int]:
    """(follow-ups on the previous turn's target, follow-ups, forced moves) over successful
    turn pairs. A forced move leaves the degraded target while it is degraded: its pin must
    not hold (an affinity pin never points at an ejected target)."""
    turns: dict[int, dict[int, Result]] = defaultdict(dict)
    for r in results:
        if r.kind == CHAT:
            turns[r.ident][r.turn] = r
    degraded = next(p.model for p in PROFILES if p.name == DEGRADED)
    same = total = forced = 0
    for conversation in turns.values():
        for turn, result in conversation.items():
            before = conversation.get(turn - 1)
            if turn and before and before.model and result.model:
                total += 1
                same += result.model == before.model
                forced += (result.model != before.model and before.model == degraded
                           and starts["degrade"] <= result.at < starts["recover"])
    return same, total, forced


def phase_rows(results: list[Result], starts: dict[str, float]) -> list[dict[str, object]]:
    by_phase: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_phase[_phase(r.at, starts)].append(r)
    rows = []
    for phase in [*starts, "all"]:
        chosen = results if phase == "all" else by_phase[phase]
        latencies = [r.latency for r in chosen]
        debug = [r for r in chosen if r.kind == DEBUG and r.error is None]
        same, total, forced = stickiness(chosen, starts)
        rows.append({
            "phase": phase, "requests": len(chosen),
            "errors": sum(r.error is not None for r in chosen),
            "simple": _per_1k(chosen, SIMPLE), "complex": _per_1k(chosen, DEBUG),
            "chat": _per_1k(chosen, CHAT),
            "p50": _percentile(latencies, 0.50), "p95": _percentile(latencies, 0.95),
            "validated": sum(r.model in VALIDATED for r in debug) / len(debug) if debug else 1,
            "sticky": (same, total, forced),
        })
    return rows


def bucket_shares(attempts: list[Attempt], total_s: float) -> list[dict[str, float]]:
    counts: list[Counter[str]] = [Counter() for _ in range(int(total_s // BUCKET_S) + 1)]
    for a in attempts:
        index = int(a.at // BUCKET_S)
        if 0 <= index < len(counts):
            counts[index][a.provider] += 1
    return [{p.name: c[p.name] / max(1, sum(c.values())) for p in PROFILES} for c in counts]


@dataclass(frozen=True)
class Drift:
    steady_share: float
    drain_s: float | None
    after_drain: float | None
    worst_bucket: float | None
    half_share_s: float | None


def _sliding(attempts: list[Attempt], begin: float, end: float,
             degraded: str = DEGRADED) -> list[tuple[float, float]]:
    """(t, the degraded target's share of the attempts in [t − 5 s, t)) for t every second
    from `begin` + 5 s to `end`: the drain and the return are timed on a sliding 5 s share,
    to the second, not to the 5 s table's bucket edges."""
    points = []
    t = begin + BUCKET_S
    while t <= end + 1e-9:
        inside = [a for a in attempts if t - BUCKET_S <= a.at < t]
        points.append((t, sum(a.provider == degraded for a in inside) / max(1, len(inside))))
        t += 1.0
    return points


def drift(attempts: list[Attempt], starts: dict[str, float], total_s: float,
          degraded: str = DEGRADED) -> Drift:
    """The degraded target's drain and return (the module's definitions)."""
    steady = [a for a in attempts if starts["steady"] <= a.at < starts["degrade"]]
    steady_share = sum(a.provider == degraded for a in steady) / max(1, len(steady))
    degrade, recover = starts["degrade"], starts["recover"]
    drain_s = after = worst = None
    for t, share in _sliding(attempts, degrade, recover, degraded):
        if share >= DRAINED:
            continue
        # Drained at the start of the first 5 s under 1 % that the rest of the degradation
        # bears out; measured from then to the recovery.
        begin = t - BUCKET_S
        span = [a for a in attempts if begin <= a.at < recover]
        rest = sum(a.provider == degraded for a in span) / max(1, len(span))
        if rest < steady_share / 2:
            drain_s, after = begin - degrade, rest
            worst = max(s for _, s in _sliding(attempts, begin, recover, degraded))
            break
    back = next((t for t, share in _sliding(attempts, recover, total_s, degraded)
                 if share >= steady_share / 2), None)
    return Drift(steady_share, drain_s, after, worst, None if back is None else back - recover)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _secs(x: float | None) -> str:
    return "never" if x is None else f"{x:.0f} s"


def report(runs: dict[str, Run], starts: dict[str, float], total_s: float, window: int,
           caption: str) -> str:
    lines = [f"# Routing quality under drift ({caption})", "",
             f"Phases (s from the start): {', '.join(f'{k} {v:.0f}' for k, v in starts.items())}"
             f", end {total_s:.0f}; observation window {window} s. The `{DEGRADED}` target "
             "degrades (10× latency, 10 % 503s) in the degrade phase.", "",
             "| strategy | phase | requests | client errors | $ / 1k simple | $ / 1k complex "
             "| $ / 1k chat turns | p50 s | p95 s | complex on validated | stickiness "
             "| stickiness, forced moves aside |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for strategy, (results, _) in runs.items():
        for row in phase_rows(results, starts):
            same, total, forced = row["sticky"]
            kept = total - forced
            lines.append(
                f"| {strategy} | {row['phase']} | {row['requests']} | {row['errors']} | "
                f"{row['simple']:.3f} | {row['complex']:.3f} | {row['chat']:.3f} | "
                f"{row['p50']:.2f} | {row['p95']:.2f} | {_pct(row['validated'])} | "
                f"{_pct(same / total if total else None)} ({same}/{total}) | "
                f"{_pct(same / kept if kept else None)} ({same}/{kept}) |")
    lines += ["", f"The `{DEGRADED}` target:", "",
              "| strategy | steady share | time to drain | share after drain | worst 5 s after "
              "drain | time to half share after recovery |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for strategy, (_, attempts) in runs.items():
        d = drift(attempts, starts, total_s)
        lines.append(f"| {strategy} | {_pct(d.steady_share)} | {_secs(d.drain_s)} | "
                     f"{_pct(d.after_drain)} | {_pct(d.worst_bucket)} | {_secs(d.half_share_s)} |")
    names = [p.name for p in PROFILES]
    lines += ["", "Share of upstream attempts per 5 s (" + " / ".join(names) + ", %):", "",
              "| t (s) | phase | " + " | ".join(runs) + " |",
              "| ---: | --- |" + " --- |" * len(runs)]
    tables = {s: bucket_shares(a, total_s) for s, (_, a) in runs.items()}
    for b in range(int(total_s // BUCKET_S)):
        cells = [" / ".join(f"{100 * tables[s][b][n]:.0f}" for n in names) for s in runs]
        lines.append(f"| {b * BUCKET_S:.0f} | {_phase(b * BUCKET_S, starts)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
