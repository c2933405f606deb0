"""Shadow traffic (docs/rollout.md §4): a sampled share of a group's live requests mirrored
to a candidate target, sent by the sidecar after the live decision through Envoy's loopback
shadow listener (envoy_config/shadow_listener.py).

The caller never waits for the mirror (it is a task started after the decision, on the
sidecar's loop), never sees it, and is never charged for it: it goes around ext_proc, so
no quota, spend ceiling or budget pressure counts it, and its rows are `shadow_requests`,
not caller usage. The mirror has its own bounds (mirror_bounds.py) and stops itself at
them. What the candidate did reaches its observations through the shadow listener's
access log (the access-log receiver asks `feeds`), and each mirrored request is paired
with its live answer (this object is a sink of the access log for the live request ids
it mirrored): a `shadow_requests` row and the figures of `/metrics`.

Bounded: requests in flight per group (`max_concurrent`), the answer read up to
MAX_ANSWER_BYTES, pairs waiting for their other half at most MAX_PAIRS (oldest dropped)
and never longer than the longest a request can take.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sidecar.billing import Usage, cost_usd
from sidecar.bridge.registry import Translator
from sidecar.config.models import SidecarConfig
from sidecar.dialects.apis import DEFAULT_ANTHROPIC_VERSION, Dialect
from sidecar.envoy_config.addresses import split_host_port
from sidecar.envoy_contract import (
    SHADOW_CLUSTER_HEADER,
    SHADOW_TOKEN_HEADER,
    target_cluster_name,
)
from sidecar.gateway.runtime import TargetRoute
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.observe.entries import outcome_of_status
from sidecar.rollout.mirror_answer import (
    MirrorAnswer,
    declared_tools,
    finish_class,
    kept_tools,
    read_answer,
)
from sidecar.rollout.mirror_bounds import MirrorBounds
from sidecar.rollout.mirror_http import LoopbackClient, ReplyError
from sidecar.routing.decision import Decision
from sidecar.routing.request import RequestSummary
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import MirrorRow
from sidecar.telemetry.rows import cost_usd as result_cost

log = logging.getLogger("sidecar.shadow_traffic")
_limited = LogLimiter(log, burst=1, interval=60.0)

MAX_ANSWER_BYTES = 4 << 20
MAX_PAIRS = 4096
MIRRORED_DIALECTS = frozenset({Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES})
# Outcomes of a sampled decision (`/metrics` labels, fixed), beside mirror_bounds' bounds.
SENT, SAME_TARGET, NEEDS_BRIDGE, DIALECT = "sent", "same_target", "needs_bridge", "dialect"
NO_LISTENER = "no_listener"   # the sidecar was not told where Envoy's shadow listener is
FAILED_TO_SEND = "failed_to_send"   # a bug: logged (rate-limited), never the caller's
UNTRANSLATABLE = "untranslatable"   # the group's bridge cannot carry the request there
# The class of an answer Envoy's shadow listener gave itself (no token, no such route).
LISTENER_REFUSED = "listener_refused"
READ_INLINE_BYTES = 64 << 10   # answers longer than this are read on a worker thread


@dataclass(slots=True)
class _Group:
    bounds: MirrorBounds
    index: int           # the candidate's position in the group's targets
    label: str
    cluster: str


@dataclass(slots=True)
class _Pair:
    group: str
    candidate: str
    at: float            # wall clock, when mirrored
    started: float       # monotonic
    stream: bool
    tools: frozenset[str] = frozenset()   # the request's declared tool names
    answer: MirrorRow | None = None
    live: RequestResult | None = None


class ShadowTraffic:
    """`address`: Envoy's shadow listener (host:port), None when there is none (then
    nothing is mirrored, and `check-config` says why); `token`: the channel token it
    requires; `rows`: where paired rows go (the telemetry hand-off), if telemetry is on."""

    def __init__(self, config: SidecarConfig, address: str | None, token: str | None,
                 rows: Callable[[MirrorRow], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 max_request_s: float = 3600.0) -> None:
        self._address = address if address is not None and token else None
        self._token = token or ""
        self._rows = rows
        self._clock, self._wall_clock = clock, wall_clock
        self.max_request_s = max_request_s
        self._groups: dict[str, _Group] = {}
        self._config = config
        self._client: LoopbackClient | None = None
        self._tasks: set[asyncio.Task] = set()
        self._pairs: OrderedDict[str, _Pair] = OrderedDict()
        self._stopped = False
        # `/metrics`: sampled decisions by outcome, answers by result, paired requests and
        # their agreement sums, by group.
        self.outcomes: dict[tuple[str, str], int] = {}
        self.answers: dict[tuple[str, str], int] = {}
        self.pairs: dict[str, list[float]] = {}
        self.dropped = 0
        self.reconfigure(config)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def reconfigure(self, config: SidecarConfig) -> None:
        """A reload: a group that mirrors to the same candidate keeps its bounds' state —
        today's spend, the bucket, the requests in flight — under its new settings, so a
        reload never resets a cap."""
        groups = {}
        for name, group in config.models.items():
            mirror = group.rollout.shadow_traffic if group.rollout is not None else None
            if mirror is None:
                continue
            earlier = self._groups.get(name)
            index = next(i for i, t in enumerate(group.targets)
                         if f"{t.provider}/{t.model_ref}" == mirror.target)
            if earlier is not None and earlier.label == mirror.target:
                bounds = earlier.bounds
                bounds.settings = mirror
            else:
                bounds = MirrorBounds(mirror, self._clock, self._wall_clock)
            groups[name] = _Group(bounds, index, mirror.target, target_cluster_name(
                name, index, group.targets[index].provider))
        self._groups, self._config = groups, config
        self.groups = frozenset(groups)

    def spend(self) -> dict[str, float]:
        """Today's spend per group (`/metrics`)."""
        return {group: entry.bounds.spent_usd for group, entry in self._groups.items()}

    def in_flight(self) -> dict[str, float]:
        return {group: float(entry.bounds.in_flight) for group, entry in self._groups.items()}

    def feeds(self, group: str) -> bool:
        """Whether the candidate's answers feed its observations (the access-log receiver
        asks, for each entry of the shadow listener's log)."""
        entry = self._groups.get(group)
        return entry is not None and entry.bounds.settings.feeds_observations

    # ---- the request path: after the live decision --------------------------------------

    def offer(self, group: str, request_id: str, dialect: Dialect, summary: RequestSummary,
              decision: Decision, body: Callable[[str, bool], bytes],
              routes: Mapping[tuple[str, int, Dialect], TargetRoute],
              payload: Mapping[str, object] | None = None,
              translators: Sequence[Translator] = ()) -> bool:
        """Whether the request was mirrored (then the live request carries the marker that
        has Envoy read its answer's finish and tools: envoy_config/answer_facts.py). Never
        raises: a bug here is logged and counted, never the caller's error. `translators`:
        the group's bridges from the caller's API (runtime.bridge_translators), for a
        candidate that does not speak it."""
        try:
            return self._offer(group, request_id, dialect, summary, decision, body, routes,
                               payload or {}, translators)
        except Exception:
            self._count(group, FAILED_TO_SEND)
            _limited.exception("shadow_offer", "a mirrored request could not be started")
            return False

    def _offer(self, group: str, request_id: str, dialect: Dialect, summary: RequestSummary,
               decision: Decision, body: Callable[[str, bool], bytes],
               routes: Mapping[tuple[str, int, Dialect], TargetRoute],
               payload: Mapping[str, object], translators: Sequence[Translator]) -> bool:
        """A live decision of a mirrored group. Cheap unless sampled and admitted: then the
        body is copied once (`body(model_ref, ask_usage)`) and the send is a task.
        `routes`: the runtime's, for the candidate's route in the caller's API (a bridge
        cluster, or none, when it does not speak that API natively)."""
        entry = self._groups.get(group)
        if entry is None or self._stopped or not entry.bounds.sampled():
            return False
        if self._address is None:
            return self._count(group, NO_LISTENER)
        if decision.primary.index == entry.index:
            return self._count(group, SAME_TARGET)
        if dialect not in MIRRORED_DIALECTS:
            return self._count(group, DIALECT)
        found = routes.get((group, entry.index, dialect))
        target, stream = dialect, summary.stream
        if found is None or found.cluster != entry.cluster:
            # A candidate of another API: the group's bridge translates the request for it,
            # as for a bridged attempt (unary, as bridged calls are), and its answer is read
            # in its own API; the mirror goes to its own target cluster, not the bridge's.
            bridged = next(((t, r) for t in translators
                            if (r := routes.get((group, entry.index, t.target))) is not None
                            and r.cluster == entry.cluster), None)
            if bridged is None:
                return self._count(group, NEEDS_BRIDGE)
            translator, found = bridged
            try:
                translated = translator.request(dict(payload))
            except Exception:  # a field the candidate's API cannot express
                return self._count(group, UNTRANSLATABLE)
            target, stream = translator.target, False
            body = lambda ref, _ask: json.dumps({**translated, "model": ref}).encode()  # noqa: E731
        route = (found.cluster, found.path, found.model_ref)
        price = self._config.target_prices.get(entry.label)
        estimate = (cost_usd(price, Usage(summary.estimated_input_tokens, summary.output_budget))
                    if price is not None else None) or 0.0
        refused = entry.bounds.admit(estimate)
        if refused is not None:
            return self._count(group, refused)
        try:
            cluster, path, model_ref = route
            ask_usage = stream and target is Dialect.OPENAI_CHAT
            sent = body(model_ref, ask_usage)
            tools = declared_tools(payload)
        except Exception:
            entry.bounds.done(entry.bounds.day, estimate, 0.0)
            raise
        self._count(group, SENT)
        self._forget_old()
        if request_id:
            if len(self._pairs) >= MAX_PAIRS:
                self._pairs.popitem(last=False)
                self.dropped += 1
            self._pairs[request_id] = _Pair(group, entry.label, self._wall_clock(),
                                            self._clock(), summary.stream, tools)
        task = asyncio.get_running_loop().create_task(self._send(
            group, entry, request_id, target, stream, summary, cluster, path, sent, estimate,
            entry.bounds.day, tools))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _count(self, group: str, outcome: str) -> bool:
        """Count a sampled decision's outcome; False: it was not mirrored."""
        key = (group, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        return False

    # ---- the mirror -----------------------------------------------------------------------

    async def _send(self, group: str, entry: _Group, request_id: str, dialect: Dialect,
                    stream: bool, summary: RequestSummary, cluster: str, path: str,
                    payload: bytes, estimate: float, day: int, tools: frozenset[str]) -> None:
        """`dialect`, `stream`: the candidate's API and whether the mirror streams."""
        cost = None
        try:
            row = await self._exchange(group, entry, dialect, stream, summary, cluster, path,
                                       payload, tools)
            cost = row.shadow_cost_usd
            key = (group, "answered" if row.shadow_error_class == "ok" else "failed")
            self.answers[key] = self.answers.get(key, 0) + 1
            pair = self._pairs.get(request_id)
            if pair is not None:
                pair.answer = row
                self._maybe_pair(request_id, pair)
        except Exception:  # a bug must not surface anywhere near the live path
            _limited.exception("shadow_send", "a mirrored request could not be handled")
        finally:
            entry.bounds.done(day, estimate, cost)

    async def _exchange(self, group: str, entry: _Group, dialect: Dialect, stream: bool,
                        summary: RequestSummary, cluster: str, path: str,
                        payload: bytes, tools: frozenset[str]) -> MirrorRow:
        headers = {"content-type": "application/json", SHADOW_TOKEN_HEADER: self._token,
                   SHADOW_CLUSTER_HEADER: cluster,
                   "x-request-id": f"shadow-{secrets.token_hex(12)}"}
        if dialect.is_anthropic:
            headers["anthropic-version"] = DEFAULT_ANTHROPIC_VERSION
        client = self._http()
        started = self._clock()
        first, status, error_class, body = None, 0, None, b""
        timeout = self._config.deadline_seconds(self._config.models[group])
        try:
            async with asyncio.timeout(timeout):
                reply = await client.post(path, headers, payload, MAX_ANSWER_BYTES)
            first, status, body = reply.first_byte_at, reply.status, reply.body
            if reply.refused_by_listener:
                error_class = LISTENER_REFUSED
        except TimeoutError:
            error_class = "upstream_timeout"
        except (OSError, ValueError, ReplyError, asyncio.IncompleteReadError):
            error_class = "connect_failure"
        ended = self._clock()
        if error_class is None:
            error_class = outcome_of_status(status).value
        wants_json = summary.structured_output is not None
        if not 200 <= status < 300:
            answer = MirrorAnswer()
        elif len(body) <= READ_INLINE_BYTES:
            answer = read_answer(body, stream, dialect, wants_json, tools)
        else:  # a long answer is read off the event loop ext_proc shares
            answer = await asyncio.to_thread(read_answer, body, stream, dialect,
                                             wants_json, tools)
        price = self._config.target_prices.get(entry.label)
        cost = (cost_usd(price, Usage(answer.input_tokens, answer.output_tokens))
                if price is not None else None)
        return MirrorRow(
            at=self._wall_clock(), group=group, live_request_id="", candidate=entry.label,
            stream=stream, shadow_status=status, shadow_error_class=error_class,
            shadow_latency_ms=(ended - started) * 1000,
            shadow_ttft_ms=(first - started) * 1000 if first is not None else None,
            shadow_input_tokens=answer.input_tokens, shadow_output_tokens=answer.output_tokens,
            shadow_cost_usd=cost, shadow_finish=answer.finish,
            shadow_tools=",".join(answer.tool_names),
            shadow_tool_arguments_valid=answer.tool_arguments_valid,
            shadow_json_valid=answer.json_valid)

    def _http(self) -> LoopbackClient:
        if self._client is None:
            assert self._address is not None
            host, port = split_host_port(self._address)
            room = max(1, sum(g.bounds.settings.max_concurrent for g in self._groups.values()))
            self._client = LoopbackClient(host, port, max_idle=room, clock=self._clock)
        return self._client

    async def stop(self) -> None:
        """Nothing is mirrored from now on (a draining sidecar still decides)."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    # ---- the live half, from the access log ----------------------------------------------

    def wants(self, request_id: str) -> bool:
        return request_id in self._pairs

    def finished(self, result: RequestResult) -> None:
        pair = self._pairs.get(result.request_id)
        if pair is not None:
            pair.live = result
            self._maybe_pair(result.request_id, pair)

    def fallback(self, transition) -> None:
        """Attempts are the live row's business, not the pair's."""

    def _maybe_pair(self, request_id: str, pair: _Pair) -> None:
        if pair.answer is None or pair.live is None:
            return
        del self._pairs[request_id]
        live, row = pair.live, pair.answer
        row.at, row.live_request_id = pair.at, request_id
        row.live_target = live.serving_target
        row.live_status, row.live_error_class = live.status, live.error_class
        row.live_latency_ms, row.live_ttfb_ms = live.latency_ms, live.ttfb_ms
        row.live_input_tokens, row.live_output_tokens = live.input_tokens, live.output_tokens
        row.live_cost_usd = result_cost(
            self._config.target_prices.get(live.serving_target or ""), live)
        row.both_answered = (200 <= live.status < 300 and live.error_class != "client_cancel"
                             and row.shadow_error_class == "ok")
        if row.both_answered and live.output_tokens and row.shadow_output_tokens is not None:
            row.output_ratio = row.shadow_output_tokens / live.output_tokens
        # Envoy read the live answer when it found its finish (a request the marker missed,
        # or an answer too long to read, says nothing); the candidate's was read when its
        # reader found one. Agreement is said only when both were read.
        row.live_finish = finish_class(live.answer_finish)
        live_tools = kept_tools(live.answer_tools.split(","), pair.tools) \
            if live.answer_tools else []
        if row.live_finish is not None:
            row.live_tools = ",".join(live_tools)
        if row.both_answered and row.live_finish is not None \
                and row.shadow_finish is not None:
            row.same_finish = row.live_finish == row.shadow_finish
            shadow_tools = row.shadow_tools.split(",") if row.shadow_tools else []
            row.same_tools = sorted(live_tools) == sorted(shadow_tools)
        sums = self.pairs.setdefault(pair.group, [0, 0, 0.0, 0])
        sums[0] += 1
        sums[1] += row.both_answered
        if row.output_ratio is not None:
            sums[2] += row.output_ratio
            sums[3] += 1
        if self._rows is not None:
            self._rows(row)

    def _forget_old(self) -> None:
        now, pairs = self._clock(), self._pairs
        while pairs:
            request_id, pair = next(iter(pairs.items()))
            if now - pair.started <= self.max_request_s:
                break
            del pairs[request_id]
            self.dropped += 1

