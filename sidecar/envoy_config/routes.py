"""The listener's routes: one per route class (docs/fallback-and-streaming.md, "Route
classes"), the catch-all last.

Every route sends attempt n to the n-th target of the decision (fallback.py adds the
cluster specifier to each); a route class carries what a group needs of its route that no
request header can set: the stream idle timeout and the rate-limited retry back-off.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.route.v3 import HeaderMatcher, Route, RouteAction, RouteMatch
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher

from sidecar.config.models import DEFAULT_ROUTE_CLASS, RouteClass, SidecarConfig
from sidecar.envoy_config.fallback import lone_retry_policy, retry_policy
from sidecar.envoy_config.hedging import HEDGE_ON_PER_TRY_TIMEOUT, hedge_retry_priority
from sidecar.envoy_contract import ROUTE_CLASS_HEADER


def model_group_routes(config: SidecarConfig) -> list[Route]:
    """Named route classes, then their hedging routes (hedging.py) and their routes for
    decisions of one target, the catch-all last."""
    routes = [_route(config, route_class, name)
              for route_class, name in config.route_classes.items() if name]
    routes += [_route(config, route_class, name, hedged=True)
               for route_class, name in config.hedge_route_classes.items()]
    routes += [_route(config, route_class, name, lone=True)
               for route_class, name in config.lone_route_classes.items()]
    routes.append(_route(config, DEFAULT_ROUTE_CLASS, ""))
    return routes


def _route(config: SidecarConfig, route_class: RouteClass, name: str,
           hedged: bool = False, lone: bool = False) -> Route:
    """The route of one route class: the catch-all (`name` "") or the one the decision
    picks with ROUTE_CLASS_HEADER. The idle timeout and the rate-limited retry back-off
    are route settings Envoy takes from no request header. `hedged`: the class's route
    for the requests a decision hedges (docs/hedging.md); `lone`: for decisions of one
    target (fallback.py, `lone_retry_policy`)."""
    limits = config.limits
    retries = (lone_retry_policy(config) if lone
               else retry_policy(config, route_class.rate_limit_wait_s))
    if hedged:
        retries.retry_priority = hedge_retry_priority()
    return Route(
        match=RouteMatch(prefix="/", headers=[HeaderMatcher(
            name=ROUTE_CLASS_HEADER, string_match=StringMatcher(exact=name))]
            if name else []),
        route=RouteAction(
            timeout=timedelta(seconds=limits.request_timeout_seconds),
            idle_timeout=timedelta(seconds=route_class.idle_timeout_s),
            auto_host_rewrite=True,
            retry_policy=retries,
            hedge_policy=HEDGE_ON_PER_TRY_TIMEOUT if hedged else None,
        ),
        # Also the retry buffer: a retry resends the buffered body.
        request_body_buffer_limit=limits.max_request_body_bytes,
    )
