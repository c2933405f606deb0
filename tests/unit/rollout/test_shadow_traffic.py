"""The mirror in the sidecar (rollout/shadow_traffic.py) and its HTTP/1.1 client
(rollout/mirror_http.py), against a small loopback server that answers as told: the
client's framing and bounds, and the orchestrator's counting, pairing, bounds across a
reload, failures that never reach the caller, and stop."""

from __future__ import annotations

import asyncio
import json

import pytest

from sidecar.dialects.apis import Dialect
from sidecar.envoy_contract import SHADOW_REFUSED_HEADER, target_cluster_name
from sidecar.gateway.runtime import TargetRoute
from sidecar.rollout import shadow_traffic
from sidecar.rollout.mirror_http import LoopbackClient, ReplyError
from sidecar.rollout.shadow_traffic import FAILED_TO_SEND, SENT, ShadowTraffic
from sidecar.routing.decision import Decision
from sidecar.routing.router import Router
from sidecar.telemetry.results import RequestResult
from tests.unit.routing.helpers import config, request

COMPLETION = json.dumps({"choices": [{"finish_reason": "stop", "message": {
    "content": "hi"}}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}).encode()


class Server:
    """Answers each request with the next of `replies` (raw bytes after the head)."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies, self.connections, self.requests = replies, 0, []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                self.requests.append((head, await reader.readexactly(length)))
                writer.write(self.replies.pop(0))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, IndexError):
            writer.close()


def json_reply(body: bytes, status: int = 200, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def chunked(*pieces: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in pieces) + b"0\r\n\r\n")


def test_the_client_reads_both_framings_and_reuses_its_connection() -> None:
    async def run() -> None:
        async with Server([json_reply(COMPLETION), chunked(b"data: 1\n\n", b"data: 2\n\n"),
                           b"HTTP/1.1 204 No Content\r\n\r\n"]) as server:
            client = LoopbackClient("127.0.0.1", server.port)
            first = await client.post("/v1/x", {"a": "b"}, b"{}", 1 << 20)
            second = await client.post("/v1/x", {}, b"{}", 1 << 20)
            third = await client.post("/v1/x", {}, b"{}", 1 << 20)
            assert (first.status, first.body) == (200, COMPLETION)
            assert second.body == b"data: 1\n\ndata: 2\n\n" and not second.truncated
            assert (third.status, third.body) == (204, b"")
            assert server.connections == 1   # kept alive between requests
            await client.close()
    asyncio.run(run())


def test_a_huge_chunk_is_read_only_up_to_the_bound_and_never_reused() -> None:
    async def run() -> None:
        async with Server([chunked(b"x" * (3 << 20)), json_reply(COMPLETION)]) as server:
            client = LoopbackClient("127.0.0.1", server.port)
            reply = await client.post("/", {}, b"", 1000)
            assert reply.truncated and len(reply.body) == 1000
            await client.post("/", {}, b"", 1000)
            assert server.connections == 2   # the cut one was closed
    asyncio.run(run())


@pytest.mark.parametrize("bad", [
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-5\r\nxx\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"garbage\r\n\r\n",
])
def test_broken_framing_is_a_reply_error(bad: bytes) -> None:
    async def run() -> None:
        async with Server([bad]) as server:
            with pytest.raises(ReplyError):
                await LoopbackClient("127.0.0.1", server.port).post("/", {}, b"", 1000)
    asyncio.run(run())


GROUP = """
  g:
    targets:
      - {provider: p, model_ref: live, pricing: {input_per_mtok: 1, output_per_mtok: 1}}
      - {provider: q, model_ref: cand, pricing: {input_per_mtok: 1, output_per_mtok: 1}}
    rollout:
      shadow_traffic: {target: q/cand, shadow_only: true, sample_percent: 100,
                       max_concurrent: %d}
"""


def mirror_for(port: int, max_concurrent: int = 4, rows: list | None = None):
    cfg = config(GROUP % max_concurrent)
    traffic = ShadowTraffic(cfg, f"127.0.0.1:{port}", "token",
                            rows.append if rows is not None else None)
    routes = {("g", 1, Dialect.OPENAI_CHAT): TargetRoute(
        target_cluster_name("g", 1, "q"), "/q/v1/chat/completions", "cand")}
    decision = Router(cfg).decide(request())
    assert isinstance(decision, Decision) and decision.primary.label == "p/live"
    return cfg, traffic, routes, decision


def test_mirrored_requests_pair_with_their_live_answers_in_either_order() -> None:
    async def run() -> None:
        rows: list = []
        async with Server([json_reply(COMPLETION), json_reply(COMPLETION)]) as server:
            _, traffic, routes, decision = mirror_for(server.port, rows=rows)
            body = lambda ref, ask: json.dumps({"model": ref}).encode()  # noqa: E731
            live = RequestResult("early", 200, "p/live", 1, "ok", 50.0, 20.0, 5, 4,
                                 answer_finish="stop")
            traffic.offer("g", "early", Dialect.OPENAI_CHAT, request(), decision, body,
                          routes, {})
            assert traffic.wants("early")
            traffic.finished(live)            # the live answer first
            traffic.offer("g", "late", Dialect.OPENAI_CHAT, request(), decision, body,
                          routes, {})
            while traffic._tasks:
                await asyncio.sleep(0.01)
            traffic.finished(RequestResult("late", 200, "p/live", 1, "ok", 50.0, 20.0, 5,
                                           4))   # the live answer last
            head, sent = server.requests[0]
            assert b"x-sidecar-shadow-token: token" in head
            assert b"x-sidecar-shadow-cluster: target__g__1__q" in head
            assert json.loads(sent) == {"model": "cand"}
            await traffic.stop()
        assert [row.live_request_id for row in rows] == ["early", "late"]
        for row in rows:
            assert row.both_answered and row.output_ratio == pytest.approx(0.5)
            assert row.shadow_output_tokens == 2 and row.live_target == "p/live"
        # The live answer Envoy read (the first): the same finish, no tools on either side;
        # one Envoy did not read (the second): nothing said about agreement.
        assert (rows[0].live_finish, rows[0].same_finish, rows[0].same_tools) == (
            "stop", True, True)
        assert (rows[1].live_finish, rows[1].live_tools, rows[1].same_finish,
                rows[1].same_tools) == (None, None, None, None)
        assert traffic.outcomes == {("g", SENT): 2}
        assert traffic.answers == {("g", "answered"): 2} and not traffic._pairs
    asyncio.run(run())


def test_a_listener_refusal_is_not_the_candidates_and_a_reload_keeps_the_bounds() -> None:
    async def run() -> None:
        refused = json_reply(b"", 403, f"{SHADOW_REFUSED_HEADER}: 1\r\n")
        async with Server([refused]) as server:
            _, traffic, routes, decision = mirror_for(server.port, max_concurrent=1)
            body = lambda ref, ask: b"{}"  # noqa: E731
            traffic.offer("g", "r1", Dialect.OPENAI_CHAT, request(), decision, body, routes)
            traffic.offer("g", "r2", Dialect.OPENAI_CHAT, request(), decision, body, routes)
            assert traffic.outcomes[("g", "max_concurrent")] == 1
            bounds = traffic._groups["g"].bounds
            spent = bounds.spent_usd
            traffic.reconfigure(config((GROUP % 1).replace("sample_percent: 100",
                                                           "sample_percent: 50")))
            assert traffic._groups["g"].bounds is bounds and bounds.spent_usd == spent
            assert bounds.in_flight == 1     # the request in flight is still counted
            while traffic._tasks:
                await asyncio.sleep(0.01)
            assert bounds.in_flight == 0
            assert traffic.answers == {("g", "failed"): 1}
            await traffic.stop()
    asyncio.run(run())


def test_a_failure_to_start_a_mirror_is_counted_and_never_raised() -> None:
    async def run() -> None:
        _, traffic, routes, decision = mirror_for(1)

        def broken(ref: str, ask: bool) -> bytes:
            raise RuntimeError("a bug")

        traffic.offer("g", "r1", Dialect.OPENAI_CHAT, request(), decision, broken, routes)
        assert traffic.outcomes == {("g", FAILED_TO_SEND): 1}
        assert traffic._groups["g"].bounds.in_flight == 0
        await traffic.stop()   # stopped: nothing more is mirrored
        traffic.offer("g", "r2", Dialect.OPENAI_CHAT, request(), decision,
                      lambda ref, ask: b"{}", routes)
        assert sum(traffic.outcomes.values()) == 1 and not traffic._tasks
    asyncio.run(run())


def test_pairs_waiting_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(shadow_traffic, "MAX_PAIRS", 3)

    async def run() -> None:
        _, traffic, routes, decision = mirror_for(1, max_concurrent=256)
        for n in range(10):
            traffic.offer("g", f"r{n}", Dialect.OPENAI_CHAT, request(), decision,
                          lambda ref, ask: b"{}", routes)
        assert len(traffic._pairs) == 3 and traffic.dropped == 7
        await traffic.stop()
    asyncio.run(run())


def test_a_candidate_of_another_api_gets_the_bridges_translation_or_is_counted() -> None:
    from sidecar.bridge.registry import translator_for

    async def run() -> None:
        answer = json.dumps({"type": "message", "stop_reason": "end_turn", "content": [
            {"type": "text", "text": "hi"}], "usage": {"input_tokens": 5,
                                                       "output_tokens": 2}}).encode()
        async with Server([json_reply(answer)]) as server:
            _, traffic, _, decision = mirror_for(server.port)
            # The candidate speaks Anthropic Messages only: no Chat route of its cluster.
            routes = {("g", 1, Dialect.ANTHROPIC_MESSAGES): TargetRoute(
                target_cluster_name("g", 1, "q"), "/q/v1/messages", "cand")}
            bridge = translator_for(Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES)
            payload = {"model": "g", "messages": [{"role": "user", "content": "hello"}]}
            traffic.offer("g", "r1", Dialect.OPENAI_CHAT, request(), decision,
                          lambda ref, ask: b"never used", routes, payload, (bridge,))
            traffic.offer("g", "r2", Dialect.OPENAI_CHAT, request(), decision,
                          lambda ref, ask: b"never used", routes, payload, ())
            traffic.offer("g", "r3", Dialect.OPENAI_CHAT, request(), decision,
                          lambda ref, ask: b"", routes, {"messages": "not a list"}, (bridge,))
            while traffic._tasks:
                await asyncio.sleep(0.01)
            head, sent = server.requests[0]
            assert head.startswith(b"POST /q/v1/messages ")
            assert b"anthropic-version:" in head
            body = json.loads(sent)
            assert body["model"] == "cand" and body["messages"][0]["role"] == "user"
            assert traffic.outcomes == {("g", SENT): 1, ("g", "needs_bridge"): 1,
                                        ("g", "untranslatable"): 1}
            assert traffic.answers == {("g", "answered"): 1}
            await traffic.stop()
    asyncio.run(run())
