"""bench/target_introduction.py's introduction through the real stack, for a check of the
simulation: one member of the workload family, `sidecar up` (real Envoy, the real sidecar,
its SQLite telemetry) in front of fake providers playing the member's profiles, driven by
the member's own arrivals with the official `openai` SDK (family_stack.py's client). One
observation window in, the configuration file is rewritten — the member's budget target
becomes a live target — and the sidecar reloads it as an operator's edit does. Before it,
`shadow` mirrors `--sample-percent` of the decisions to that target through Envoy's
shadow listener; `cold` does not know the target.

Read from the rows the gateway wrote (decisions after the reload: those of the new
configuration's policy version): caller requests until the new target carries 90 % of its
steady share over a sliding 100, caller requests it was selected for while some target
was cold (`cold_start` not `all_warm`: after the warm-up only the new target can be), its
steady share, and the mirrored requests (`shadow_requests`). The same member's simulated
figures (target_introduction.py) are printed beside them.

Usage:  PYTHONPATH=.:bench .venv/bin/python bench/target_introduction_stack.py [--seed 0]
            [--window 60] [--rate 8] [--sample-percent 5]
            [--output bench/results/target_introduction_stack.md]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import yaml
from family_stack import _drive, behaviour, config_text
from family_workloads import member
from mode_runner import publish
from target_introduction import (
    NEW_SLOT,
    SLIDING,
    USED_WELL,
    WINDOWS_AFTER,
    WINDOWS_BEFORE,
    Introduction,
    measure,
)

from sidecar.config.loading import load_config_text
from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import FakeProvider
from sidecar.routing.policy_version import policy_version


def _texts(base, window: int, providers, telemetry: Path, sample: float) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The configuration before (cold, mirrored) and after the reload, as files say it."""
    after = yaml.safe_load(config_text(base, "dynamic_score", window, providers, telemetry))
    group = after["models"]["family"]
    new = next(t for t in group["targets"] if t["provider"] == NEW_SLOT)
    cold = {**after, "models": {"family": {**group, "targets": [
        t for t in group["targets"] if t is not new]}}}
    mirrored = {**after, "models": {"family": {**group, "rollout": {"shadow_traffic": {
        "target": f"{NEW_SLOT}/{new['model_ref']}", "shadow_only": True,
        "sample_percent": sample, "max_per_minute": 600, "max_daily_usd": 1000.0,
        "max_concurrent": 16}}}}}
    dump = lambda data: yaml.safe_dump(data, sort_keys=False)  # noqa: E731
    return {"cold": dump(cold), "shadow": dump(mirrored), "after": dump(after)}


def run_variant(seed: int, variant: str, window: int, rate: float, sample: float,
                workdir: Path) -> dict[str, float | int | None]:
    base = replace(member(seed), sick="none")
    fakes = {slot: FakeProvider(slot, seed=seed) for slot, _, _ in base.targets}
    for slot, profile, _ in base.targets:
        fakes[slot].behaviour = behaviour(profile, None, False)
    telemetry = workdir / f"{variant}.db"
    with ProviderThread(list(fakes.values())) as providers:
        texts = _texts(base, window, providers, telemetry, sample)
        config = workdir / f"{variant}.yaml"
        config.write_text(texts[variant])
        up = UpProcess(["--config", str(config)], log_path=workdir / f"{variant}.log")
        with up.running():
            async def reload() -> None:
                await asyncio.sleep(WINDOWS_BEFORE * window)
                config.write_text(texts["after"])  # watched: the sidecar reloads it

            asyncio.run(_drive(base, up, fakes, window, rate,
                               (WINDOWS_BEFORE + WINDOWS_AFTER) * window, reload))
            time.sleep(3)  # the last rows on their way to SQLite
    after = load_config_text(texts["after"]).models["family"]
    version = policy_version(after.live_group())
    new_label = next(f"{t.provider}/{t.model_ref}" for t in after.targets
                     if t.provider == NEW_SLOT)
    with sqlite3.connect(telemetry) as db:
        rows = db.execute("SELECT started_at, selected_target, cold_start FROM request_rows "
                          "WHERE policy_version = ? ORDER BY started_at", (version,)).fetchall()
        mirrored = db.execute("SELECT COUNT(*) FROM shadow_requests").fetchone()[0]
    if not rows:
        raise RuntimeError(f"{variant}: no decision under the reloaded configuration")
    end = rows[-1][0]
    last = [target for at, target, _ in rows if at >= end - WINDOWS_AFTER * window / 4]
    steady = sum(target == new_label for target in last) / len(last)
    recent: deque[bool] = deque(maxlen=SLIDING)
    until = None
    for index, (_, target, _) in enumerate(rows):
        recent.append(target == new_label)
        if len(recent) == SLIDING and steady > 0 and sum(recent) / SLIDING >= USED_WELL * steady:
            until = index + 1
            break
    cold = sum(1 for _, target, state in rows
               if target == new_label and state not in (None, "all_warm"))
    return {"until": until, "cold": cold, "steady": steady, "mirrored": mirrored,
            "decisions": len(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=60)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--sample-percent", type=float, default=5.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    stack, simulated = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("cold", "shadow"):
            stack[variant] = run_variant(args.seed, variant, args.window, args.rate,
                                         args.sample_percent, Path(tmp))
            simulated[variant] = measure(Introduction(member(args.seed), variant, args.window,
                                                      args.rate, args.sample_percent))
    lines = [
        "# A new target introduced by shadow traffic, against cold: the stack beside the "
        "simulation",
        "",
        f"`bench/target_introduction_stack.py --seed {args.seed} --window {args.window} "
        f"--rate {args.rate:g} --sample-percent {args.sample_percent:g}`, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: member {member(args.seed).name}, its "
        "drift left out; one run of the real stack per variant; the simulated figures are "
        "bench/target_introduction.py's for the same member.",
        "",
        "| variant | side | requests until used well | cold serves | steady share | "
        "mirrored |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for variant in ("cold", "shadow"):
        s, m = stack[variant], simulated[variant]
        lines.append(f"| {variant} | stack | {s['until'] or 'never'} | {s['cold']} | "
                     f"{s['steady']:.1%} | {s['mirrored']} |")
        lines.append(f"| {variant} | simulation | {m.requests_until_used_well or 'never'} | "
                     f"{m.cold_serves} | {m.steady_share:.1%} | {m.mirrored} |")
    publish("\n".join(lines) + "\n", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
