"""What is wrong with a configuration: one `ConfigProblem` per place, `path: message`.

Every layer of the check (YAML, validation, cross-references, secrets) words its findings
as problems with the dotted YAML path of the place they concern (`models.g.targets[0]
.weight`), so `check-config`, a rejected reload and a refused start read the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """Raised when a configuration cannot be used; carries every problem found."""

    def __init__(self, problems: Sequence[ConfigProblem], source: str = "configuration") -> None:
        self.problems = list(problems)
        self.source = source
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        super().__init__(f"{source} has {len(self.problems)} problem(s):\n{lines}")


def counted(problems: Sequence[object]) -> str:
    """`1 problem`, `3 problems`."""
    return f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
