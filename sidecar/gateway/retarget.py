"""Retarget a retry: the copy of the request that Envoy sends to the next target of the
decision after an earlier attempt failed before the response started.

The router-level exchange already rewrote the request for the primary (path, model).
Envoy runs a per-attempt hook only on retries (docs/fallback-and-streaming.md); it names
the attempt's cluster, and this module rewrites the copy for that target. Nothing here
decides anything: the order was fixed by the routing decision. Keys are Envoy's business:
each target cluster clears every credential header and injects its own
(envoy_config/credentials.py). A retry that cannot be rewritten is refused rather than sent
with the previous target's model.
"""

from __future__ import annotations

from sidecar.dialects.apis import Dialect
from sidecar.dialects.body import BodyError, parse_body
from sidecar.gateway.outcome import Retarget, body_size
from sidecar.gateway.runtime import Runtime, TargetRoute


class RetargetError(Exception):
    """The retry cannot be rewritten; the message is safe to log and to show."""


def attempt_dialect(path: str) -> Dialect | None:
    """The caller's dialect, from the primary's upstream path (which ends with the
    dialect's endpoint: the router-level rewrite made it so)."""
    path = path.split("?", 1)[0]
    for dialect in Dialect:
        if path.endswith(dialect.endpoint):
            return dialect
    return None


def _dialect(value: str) -> Dialect | None:
    try:
        return Dialect(value)
    except ValueError:
        return None


def attempt_route(runtime: Runtime, cluster: str, path: str,
                  caller_api: str | None = None) -> TargetRoute:
    """`caller_api`: the header the decision set in groups with bridges (a bridged attempt
    rewrote the path to its target's API, and header changes carry over to retries)."""
    dialect = _dialect(caller_api) if caller_api else attempt_dialect(path)
    route = runtime.cluster_routes.get((cluster, dialect)) if dialect else None
    if route is None:
        raise RetargetError(f"no route for a retry to {cluster} on {path}")
    return route


def retarget(route: TargetRoute, body: bytes) -> Retarget:
    try:
        new_body = parse_body(body).model_replaced(route.model_ref)
    except BodyError as exc:
        raise RetargetError(f"retry body unreadable: {exc}") from None
    set_headers = ((":path", route.path), ("content-length", str(body_size(new_body))))
    return Retarget(set_headers, (), new_body)
