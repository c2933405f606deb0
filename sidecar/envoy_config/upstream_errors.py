"""A provider's error that ends a request becomes the gateway's own JSON error.

When the last attempt a request may make still fails with a 429 or a 5xx, that response is
final (Envoy retried the earlier ones on the next target). Its body is the provider's: it
may be HTML from a load balancer, may name the provider's organisation or limits, and says
nothing of the attempts made. Envoy's custom-response filter replaces it, in Envoy and only
for upstream responses, with the gateway's message: how many attempts failed and the
class of the last status. The replacement is a local reply, so the local-reply mappers
(local_replies.py) put it in the caller's dialect like every other gateway error.

Status: a final 429 stays 429 (SDKs back off and retry); any final 5xx becomes 502, and so
does a provider's 401/403 (the gateway's key was refused, not the caller's token: passing
it through would make the caller's SDK blame the caller's credentials). Other 4xx are the
request's own fault and pass through unchanged.
"""

from __future__ import annotations

from envoy_data_plane.envoy.config.core.v3 import DataSource, SubstitutionFormatString
from envoy_data_plane.envoy.extensions.filters.http.custom_response.v3 import CustomResponse
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.http.custom_response.local_response_policy.v3 import (
    LocalResponsePolicy,
)
from envoy_data_plane.envoy.type.matcher.v3 import (
    HttpResponseLocalReplyMatchInput,
    HttpResponseStatusCodeClassMatchInput,
    HttpResponseStatusCodeMatchInput,
)
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.core.v3 import TypedExtensionConfig
from envoy_data_plane.xds.type.matcher.v3 import (
    Matcher,
    MatcherMatcherList,
    MatcherMatcherListFieldMatcher,
    MatcherMatcherListPredicate,
    MatcherMatcherListPredicatePredicateList,
    MatcherMatcherListPredicateSinglePredicate,
    MatcherOnMatch,
    StringMatcher,
)

MESSAGE = ("No target of this model group could serve the request (attempts: "
           "%UPSTREAM_REQUEST_ATTEMPT_COUNT%; last upstream status: {status}). "
           "Try again later.")


def _single(name: str, input_config: object, match: StringMatcher) -> MatcherMatcherListPredicate:
    return MatcherMatcherListPredicate(single_predicate=MatcherMatcherListPredicateSinglePredicate(
        input=TypedExtensionConfig(name=name, typed_config=Any.pack(input_config)),
        value_match=match))


def _all(*predicates: MatcherMatcherListPredicate) -> MatcherMatcherListPredicate:
    return MatcherMatcherListPredicate(
        and_matcher=MatcherMatcherListPredicatePredicateList(predicate=list(predicates)))


def _message(status_text: str) -> SubstitutionFormatString:
    return SubstitutionFormatString(
        text_format_source=DataSource(inline_string=MESSAGE.format(status=status_text)))


def _policy(name: str, status: int, body: SubstitutionFormatString) -> MatcherOnMatch:
    policy = LocalResponsePolicy(body_format=body, status_code=status)
    return MatcherOnMatch(action=TypedExtensionConfig(name=name, typed_config=Any.pack(policy)))


def final_upstream_errors() -> HttpFilter:
    from_upstream = _single("local_reply", HttpResponseLocalReplyMatchInput(),
                            StringMatcher(exact="false"))
    rate_limited = _single("status", HttpResponseStatusCodeMatchInput(),
                           StringMatcher(exact="429"))
    server_error = _single("status_class", HttpResponseStatusCodeClassMatchInput(),
                           StringMatcher(exact="5xx"))
    key_refused = MatcherMatcherListPredicate(or_matcher=MatcherMatcherListPredicatePredicateList(
        predicate=[_single("status", HttpResponseStatusCodeMatchInput(), StringMatcher(exact=code))
                   for code in ("401", "403")]))
    # The formatter only knows the new status; the message names the class it replaced.
    matchers = [
        MatcherMatcherListFieldMatcher(predicate=_all(from_upstream, rate_limited),
                                       on_match=_policy("rate_limited", 429, _message("429"))),
        MatcherMatcherListFieldMatcher(predicate=_all(from_upstream, server_error),
                                       on_match=_policy("server_error", 502, _message("5xx"))),
        MatcherMatcherListFieldMatcher(predicate=_all(from_upstream, key_refused),
                                       on_match=_policy("key_refused", 502,
                                                        _message("401/403, the gateway's "
                                                                 "provider key was refused"))),
    ]
    config = CustomResponse(custom_response_matcher=Matcher(
        matcher_list=MatcherMatcherList(matchers=matchers)))
    return HttpFilter(name="envoy.filters.http.custom_response", typed_config=Any.pack(config))
