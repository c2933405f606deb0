"""The one matcher shape the bootstrap uses several times: "skip the wrapped filter when a
header predicate holds" (an `ExtensionWithMatcher` around an HTTP filter). Used for the
retry-only retarget hook, the per-dialect credential injectors and the bounded-reply
hold; built here once so each of those says only which header and which test."""

from __future__ import annotations

from envoy_data_plane.envoy.config.core.v3 import TypedExtensionConfig as EnvoyExtensionConfig
from envoy_data_plane.envoy.extensions.common.matching.v3 import ExtensionWithMatcher
from envoy_data_plane.envoy.extensions.filters.common.matcher.action.v3 import SkipFilter
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import (
    HttpRequestHeaderMatchInput,
    HttpResponseHeaderMatchInput,
)
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.core.v3 import TypedExtensionConfig
from envoy_data_plane.xds.type.matcher.v3 import (
    Matcher,
    MatcherMatcherList,
    MatcherMatcherListFieldMatcher,
    MatcherMatcherListPredicate,
    MatcherMatcherListPredicateSinglePredicate,
    MatcherOnMatch,
    StringMatcher,
)

Predicate = MatcherMatcherListPredicate


def request_header(name: str, value: StringMatcher) -> Predicate:
    return _header(name, value, HttpRequestHeaderMatchInput(header_name=name))


def response_header(name: str, value: StringMatcher) -> Predicate:
    return _header(name, value, HttpResponseHeaderMatchInput(header_name=name))


def negated(predicate: Predicate) -> Predicate:
    return MatcherMatcherListPredicate(not_matcher=predicate)


def skip_when(predicate: Predicate) -> Matcher:
    skip = MatcherOnMatch(action=TypedExtensionConfig(name="skip",
                                                        typed_config=Any.pack(SkipFilter())))
    return Matcher(matcher_list=MatcherMatcherList(matchers=[
        MatcherMatcherListFieldMatcher(predicate=predicate, on_match=skip)]))


def skipped_when(predicate: Predicate, name: str, filter_name: str,
                 filter_config: Any) -> HttpFilter:
    """`filter_config` (an HTTP filter's packed config) as the filter `name`, skipped for
    requests (or responses) where `predicate` holds."""
    wrapped = ExtensionWithMatcher(
        xds_matcher=skip_when(predicate),
        extension_config=EnvoyExtensionConfig(name=filter_name, typed_config=filter_config))
    return HttpFilter(name=name, typed_config=Any.pack(wrapped))


def _header(name: str, value: StringMatcher, match_input: object) -> Predicate:
    return MatcherMatcherListPredicate(single_predicate=MatcherMatcherListPredicateSinglePredicate(
        input=TypedExtensionConfig(name=name.strip(":") or "header",
                                   typed_config=Any.pack(match_input)),
        value_match=value))
