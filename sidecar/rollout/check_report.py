"""What `sidecar rollout check` prints, and the exit code a CI pipeline reads (issue 42):
0 when every item that ran passed, 1 when one failed (2 is the CLI's: usage, config)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sidecar.commands.text_table import format_table
from sidecar.rollout.check_run import Verdict

MARKS = {True: "✔", False: "✘", None: "–"}


def exit_code(verdicts: Sequence[Verdict]) -> int:
    return 1 if any(v.ok is False for v in verdicts) else 0


def summary(verdicts: Sequence[Verdict]) -> dict[str, int]:
    return {"passed": sum(v.ok is True for v in verdicts),
            "failed": sum(v.ok is False for v in verdicts),
            "skipped": sum(v.ok is None for v in verdicts)}


def as_table(group: str, verdicts: Sequence[Verdict]) -> str:
    rows = [["", "item", "turn", "should", "happened"]]
    rows += [[MARKS[v.ok], v.item, str(v.turn) if v.turn else "-", v.should, v.happened]
             for v in verdicts]
    counts = summary(verdicts)
    return (f"rollout check of group {group}: {counts['passed']} passed, "
            f"{counts['failed']} failed, {counts['skipped']} not run\n\n"
            + format_table(rows))


def as_json(group: str, verdicts: Sequence[Verdict]) -> str:
    return json.dumps({"group": group, **summary(verdicts),
                       "rows": [v.as_dict() for v in verdicts]}, indent=2, ensure_ascii=False)
