"""Reusable constrained field types whose error messages read well in `check-config` output.

Pydantic's own range errors name only the bound that was crossed; operators want the whole
allowed range, so ranges are checked here and phrased as "must be between A and B".
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """Base for every configuration block: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _between(low: float, high: float):
    def check(value: float) -> float:
        if not low <= value <= high:
            raise ValueError(f"must be between {_fmt(low)} and {_fmt(high)}")
        return value

    return check


def _at_least(low: float):
    def check(value: float) -> float:
        if value < low:
            raise ValueError(f"must be at least {_fmt(low)}")
        return value

    return check


def _positive(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number greater than 0")
    return value


def _positive_int(value: int) -> int:
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


Percent = Annotated[float, AfterValidator(_finite), AfterValidator(_between(0, 100))]
Fraction = Annotated[float, AfterValidator(_finite), AfterValidator(_between(0, 1))]


def bounded(low: float, high: float) -> AfterValidator:
    """An upper and lower bound for one field (for example a timeout Envoy must accept)."""
    return AfterValidator(_between(low, high))
NonNegativeInt = Annotated[int, AfterValidator(_at_least(0))]
NonNegativeFloat = Annotated[float, AfterValidator(_finite), AfterValidator(_at_least(0))]
PositiveInt = Annotated[int, AfterValidator(_positive_int)]
PositiveFloat = Annotated[float, AfterValidator(_positive)]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError("must be an environment variable name (letters, digits, underscore)")
    return value


def _header_name(value: str) -> str:
    lowered = value.lower()
    if not _HEADER_NAME.fullmatch(lowered):
        raise ValueError("must be an HTTP header name")
    return lowered


def _sha256_hex(value: str) -> str:
    lowered = value.lower()
    if not _SHA256_HEX.fullmatch(lowered):
        raise ValueError("must be 64 hexadecimal characters (a SHA-256 digest)")
    return lowered


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
HeaderName = Annotated[str, AfterValidator(_header_name)]
Sha256Hex = Annotated[str, AfterValidator(_sha256_hex)]
NonBlank = Annotated[str, AfterValidator(_non_blank)]


class SecretSource(StrictModel):
    """A secret read from an environment variable or a file, never written in the config."""

    env: EnvName | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("set exactly one of 'env' or 'file'")
        return self
