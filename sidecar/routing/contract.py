"""The optional model-group contract: hard requirements and quality floors that every target
must meet before any scoring, whatever the strategy. Unknown metadata never meets a floor."""

from __future__ import annotations

from sidecar.config.models import Contract, Target
from sidecar.routing.capabilities import eval_quality, modalities


def contract_violation(contract: Contract, target: Target) -> str | None:
    """The first contract key `target` fails, as `contract.<key>`, or None."""
    if any(tag not in target.tags for tag in contract.require_tags):
        return "contract.require_tags"
    if contract.require_input_modalities:
        declared = modalities(target)
        if declared is None or not set(contract.require_input_modalities) <= declared:
            return "contract.require_input_modalities"
    window = target.context_window_tokens
    if contract.min_context_window is not None and (
            window is None or window < contract.min_context_window):
        return "contract.min_context_window"
    if contract.min_eval_quality_score is not None:
        quality = eval_quality(target)
        if quality is None or quality < contract.min_eval_quality_score:
            return "contract.min_eval_quality_score"
    if contract.min_validation_pass_rate is not None:
        rate = target.validation.pass_rate if target.validation else None
        if rate is None or rate < contract.min_validation_pass_rate:
            return "contract.min_validation_pass_rate"
    if contract.require_validation_status is not None and (
            target.validation is None
            or target.validation.status != contract.require_validation_status):
        return "contract.require_validation_status"
    return None
