"""Names shared by the rendered Envoy configuration and the sidecar at request time:
cluster names, the metadata namespace that carries a decision's attempt order, and the
details string that marks the sidecar's replies.

One cluster per target (not per provider) keeps Envoy's statistics and retries per target.
Names avoid dots so Envoy's stat tag extraction keeps the whole name as `cluster_name`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

EXT_PROC_CLUSTER = "sidecar_ext_proc"
# The decision's target order, as dynamic metadata read by Envoy's priority-group cluster
# specifier: attempt n goes to the n-th cluster (docs/fallback-and-streaming.md).
ROUTE_NAMESPACE = "sidecar.route"
# Beside the priority groups in ROUTE_NAMESPACE, for groups with `retry_same_target`: how
# many times in a row a held 5xx or 429 may put the same target next.
SAME_TARGET_KEY = "same_target_retries"
# ...and the longest `retry-after` of a 429 that still earns the same target next (the
# group's wait_for_retry_after_seconds).
SAME_TARGET_WAIT_KEY = "same_target_wait_s"
# ...and, for a stream whose primary has a first-event deadline of its own
# (gateway/first_event_deadline.py), that deadline in whole seconds (the reply gate reads it).
FIRST_EVENT_DEADLINE_KEY = "first_event_deadline_s"
# Where a request goes if no order was set (never by design): a cluster with no endpoints.
NO_TARGET_CLUSTER = "sidecar_no_target"
# Per-attempt retarget streams ask Envoy for this attribute, which names the attempt's target.
CLUSTER_ATTRIBUTE = "xds.cluster_name"
# `details` of the sidecar's immediate responses; Envoy's local-reply mappers skip these.
SIDECAR_REPLY_DETAILS = "sidecar_reply"

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def target_cluster_name(group: str, index: int, provider: str) -> str:
    return f"target__{_UNSAFE.sub('_', group)}__{index}__{_UNSAFE.sub('_', provider)}"


def hedge_listener_name(target_cluster: str) -> str:
    """The internal listener in front of a target cluster: a hedging pair's endpoint."""
    return f"{target_cluster}__hedge_in"


def hedge_pair_cluster_name(group: str, first: tuple[int, str], second: tuple[int, str]
                            ) -> str:
    """The cluster of a hedged decision: the group's target `first` (index, provider) at
    priority 0, `second` at priority 1 (docs/hedging.md). Providers are in the name, as in
    target clusters', so a reload that puts another provider at an index makes a new
    pair rather than sending an old decision's request to the new provider."""
    return (f"hedge__{_UNSAFE.sub('_', group)}__{first[0]}__{_UNSAFE.sub('_', first[1])}"
            f"__{second[0]}__{_UNSAFE.sub('_', second[1])}")


HEDGE_CLUSTER_PREFIX = "hedge__"


def hedge_pairs(group: str, providers: Sequence[str]) -> Iterator[tuple[int, int, str]]:
    """(first, second, pair cluster name) for every ordered pair of a hedging group's
    targets, given each target's provider: the one enumeration the bootstrap, the
    runtime's routes and the hedge budgets share."""
    for first, first_provider in enumerate(providers):
        for second, second_provider in enumerate(providers):
            if first != second:
                yield first, second, hedge_pair_cluster_name(
                    group, (first, first_provider), (second, second_provider))


def bridge_cluster_name(group: str, index: int, provider: str, caller: str) -> str:
    """The same target, reached from callers of another API through a bridge."""
    return f"{target_cluster_name(group, index, provider)}__from_{caller}"


# Set by the router-level decision in groups with bridges: the caller's API, which a retry
# cannot read from its path once a bridged attempt rewrote it. It reaches the provider too
# (it names only the caller's API): header changes carry over between attempts, so a
# cluster that stripped it would hide it from the next attempt.
CALLER_API_HEADER = "x-sidecar-caller-api"

# The configuration a request was decided with, as an opaque tag (a random value per
# configuration the sidecar loads): a retry after a reload is rewritten by that
# configuration, its targets' `model_ref`s, not the new one's. Like the caller-API marker
# it stays on the request (header changes carry over between attempts, so a cluster that
# stripped it would hide it from the next attempt's hook); it names nothing.
GENERATION_HEADER = "x-sidecar-generation"

# Observations: the gRPC access log's name, and where Envoy puts the provider's usage.
ACCESS_LOG_NAME = "sidecar_observations"
ATTEMPT_LOG_NAME = "sidecar_attempts"
USAGE_NAMESPACE = "sidecar.usage"
USAGE_KEY = "output_tokens"
# Input tokens and prompt-cache reads and writes, for telemetry rows and cost; the key says
# whether a figure is inside the reported input (OpenAI) or beside it (Anthropic):
# observe/usage_fields.py.
INPUT_TOKENS_KEY = "input_tokens"
CACHED_TOKENS_KEY = "cached_tokens"
CACHE_READ_KEY = "cache_read_tokens"
CACHE_WRITE_KEY = "cache_write_tokens"
CACHE_WRITE_INCLUDED_KEY = "cache_write_included_tokens"

# Set on a held provider reply (by the hold's Lua, or the reply gate) that another target
# may serve although its status is the request's own (a context-length 400): the route's
# retry policy retries on it. Never reaches the caller (the response allowlist drops it).
CONTEXT_RETRY_HEADER = "x-sidecar-retry"
# Set on a held provider reply whose status is a refusal's (a 400, 413, 422) but that no
# entry of the refusal catalogue knows (observe/refusal_catalogue.py): `type=…;code=…`,
# tokens only. The per-attempt access log carries it to the sidecar's counter; the
# response allowlist drops it before the caller.
UNRECOGNISED_HEADER = "x-sidecar-unrecognised"
# Added to every provider reply by the target cluster's header-mutation filter: the
# attempt's number (Envoy's count), so that the hold's Lua knows which entry of the attempt
# order refused (envoy_config/attempt_order_lua.py). The response allowlist drops it.
ATTEMPT_MARK_HEADER = "x-sidecar-attempt"
# Set on a held provider reply whose target is tried again next (a 429 or a 5xx whose
# `retry-after` is within the group's wait): the seconds Envoy's rate-limited back-off
# waits before that retry. Its own header, not `retry-after`, so that a wait is never
# spent before *another* target (issue 40). The response allowlist drops it.
SAME_TARGET_WAIT_HEADER = "x-sidecar-wait"

# Set by the decision for groups whose route settings differ from the default (a stream idle
# timeout, a wait for a 429's retry-after): Envoy picks that class's route by it. Removed by
# the route configuration before the request leaves Envoy.
ROUTE_CLASS_HEADER = "x-sidecar-route-class"

# Set by the decision on an OpenAI Chat stream whose caller did not ask for its usage: the
# gateway asked for it, and Envoy takes the usage chunk back out of the caller's stream
# (envoy_config/unasked_usage.py). Removed by the route configuration before the provider.
USAGE_UNASKED_HEADER = "x-sidecar-unasked-usage"

# A stateful session's key (SHA-256 of caller, group and session id), from the decision to
# its one attempt; stripped before the provider (sessions never retry).
SESSION_KEY_HEADER = "x-sidecar-session"


# The response cache (docs/cache.md): `hit` or `miss` on answers of groups with a cache; and
# on a miss's request, the random slot its answer is stored under (it reaches the provider:
# header changes carry over between attempts; it is random and names nothing).
CACHE_HEADER = "x-sidecar-cache"
CACHE_SLOT_HEADER = "x-sidecar-cache-slot"

# Shadow traffic (docs/rollout.md §4): the loopback listener the sidecar sends mirrored
# requests to, the header naming the candidate's target cluster, the header carrying the
# channel token (the listener answers nothing else), and its access log.
SHADOW_LISTENER = "model_groups_shadow"
SHADOW_CLUSTER_HEADER = "x-sidecar-shadow-cluster"
SHADOW_TOKEN_HEADER = "x-sidecar-shadow-token"
SHADOW_LOG_NAME = "sidecar_shadow_traffic"
# On the shadow listener's own 403 (no token, or no such candidate): not the candidate's.
SHADOW_REFUSED_HEADER = "x-sidecar-shadow-refused"
# Set by the sidecar on a live request it mirrored: Envoy reads how the answer finished and
# the tools it called (envoy_config/answer_facts.py) into this metadata namespace.
ANSWER_FACTS_HEADER = "x-sidecar-answer-facts"
ANSWER_NAMESPACE = "sidecar.answer"
