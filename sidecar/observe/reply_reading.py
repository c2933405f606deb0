"""The sidecar's own reading of a JSON reply Envoy could not read (one of undeclared length,
held at the reply gate): the same facts `json_to_metadata` leaves for a reply of declared
length (envoy_config/observation_filters.py), so the access log and the checks of
response_checks.py treat both alike.
"""

from __future__ import annotations

import json

from sidecar.observe.response_checks import (
    ERROR_TYPE_KEY,
    NOT_JSON,
    NOT_JSON_KEY,
    SHAPE_KEY,
    USAGE_MISSING,
    USAGE_MISSING_KEY,
)
from sidecar.observe.usage_fields import OUTPUT_PATHS, read_path, usage_keys

_ERROR_PATHS = (("error", "type"), ("error", "code"))
_SHAPE_PATHS = (("object",), ("type",))

Facts = dict[str, float | str]


def json_reply_facts(body: bytes) -> Facts:
    """Usage counts, and what tells a 2xx that is not a completion: an error object's type,
    a body that is not JSON, a usage path missing, the reply's shape. A body nested too
    deep for Python's parser counts as not JSON (it is no completion)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return {NOT_JSON_KEY: NOT_JSON}
    if not isinstance(document, dict):
        return {USAGE_MISSING_KEY: USAGE_MISSING}
    facts: Facts = dict(usage_keys(document))
    if any(not isinstance(read_path(document, path), int | float) for path in OUTPUT_PATHS):
        facts[USAGE_MISSING_KEY] = USAGE_MISSING
    for key, paths in ((ERROR_TYPE_KEY, _ERROR_PATHS), (SHAPE_KEY, _SHAPE_PATHS)):
        for path in paths:
            value = read_path(document, path)
            if isinstance(value, str):
                facts[key] = value
    return facts
