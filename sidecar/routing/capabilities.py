"""What a target can do, as the routing rules see it: explicit metadata first, then the
documented tag shorthands, else unknown (`None`)."""

from __future__ import annotations

from sidecar.config.models import Target

TOOL_TAG = "tool_capable"
VISION_TAG = "vision"
REASONING_TAG = "reasoning"
STRUCTURED_OUTPUT_TAG = "structured_output"


def tool_support(target: Target) -> bool | None:
    if target.supports_tools is not None:
        return target.supports_tools
    return True if TOOL_TAG in target.tags else None


def accepts_images(target: Target) -> bool | None:
    if target.input_modalities is not None:
        return "image" in target.input_modalities
    return True if VISION_TAG in target.tags else None


def modalities(target: Target) -> frozenset[str] | None:
    """Declared input modalities (text is implied), or None when unknown."""
    images = accepts_images(target)
    if images is None:
        return None
    return frozenset({"text", "image"} if images else {"text"})


def reasoning_support(target: Target) -> bool | None:
    if target.supports_reasoning is not None:
        return target.supports_reasoning
    return True if REASONING_TAG in target.tags else None


def structured_output_support(target: Target) -> bool | None:
    if target.supports_structured_output is not None:
        return target.supports_structured_output
    return True if STRUCTURED_OUTPUT_TAG in target.tags else None


def eval_quality(target: Target) -> float | None:
    """Configured evaluation quality: the mean of whichever of evaluation.quality_score,
    evaluation.pass_rate and validation.pass_rate are set; a failed validation is 0;
    None when nothing is configured."""
    if target.validation is not None and target.validation.status == "failed":
        return 0.0
    values = []
    if target.evaluation is not None:
        values += [v for v in (target.evaluation.quality_score, target.evaluation.pass_rate)
                   if v is not None]
    if target.validation is not None and target.validation.pass_rate is not None:
        values.append(target.validation.pass_rate)
    return sum(values) / len(values) if values else None
