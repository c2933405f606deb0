"""What waits for a request's access-log entries — its failed attempts, its quota charge, its
telemetry join, its cache slot — waits as long as the longest deadline. A reload may raise a
deadline (`models.*.fallback.deadline_seconds` is not restart-only): every one of those waits
follows, and none shrinks while requests started under the longer one are under way."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sidecar.config import load_config_text
from sidecar.gateway import Runtime
from sidecar.operations.assembly import RunningSidecar, longest_request_s, start_sidecar
from sidecar.operations.reload import enable_reload

CONFIG = """
providers:
  p: {{base_url: "http://127.0.0.1:9/v1"}}
callers: [{{name: team, token_sha256: "{digest}", quotas: {{tokens_per_day: 1000}}}}]
models:
  g:
    targets: [{{provider: p, model_ref: m}}]
    response_cache: {{}}
    fallback: {{per_try_timeout_seconds: 10, deadline_seconds: {deadline}}}
telemetry: {{sqlite_path: '{db}'}}
"""


def windows(sidecar: RunningSidecar) -> list[float]:
    gateway = sidecar.gateway
    assert (sidecar.receiver and gateway.quotas and gateway.caches and sidecar.telemetry)
    return [sidecar.max_request_s, sidecar.receiver.attempt_window_s,
            gateway.quotas.ledger.max_age_s, gateway.caches.slots.max_age_s,
            sidecar.telemetry.join_window_s]


def test_a_reload_that_raises_a_deadline_lengthens_every_wait(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"

    def write(deadline: int) -> str:
        text = CONFIG.format(digest="a" * 64, deadline=deadline, db=tmp_path / "t.db")
        path.write_text(text)
        return text

    config = load_config_text(write(30))

    async def scenario() -> list[list[float]]:
        sidecar = await start_sidecar(config, Runtime(config, {}), "127.0.0.1:0",
                                      "127.0.0.1:0")
        reloader = enable_reload(sidecar, path, watch_interval_s=None)
        try:
            seen = [windows(sidecar)]
            for deadline in (900, 60):
                write(deadline)
                assert (await reloader.reload("test")).ok
                seen.append(windows(sidecar))
            return seen
        finally:
            await sidecar.stop(grace=0)

    short = longest_request_s(config)
    long = longest_request_s(load_config_text(write(900)))
    assert short < 60 < 900 < long
    started, raised, lowered = asyncio.run(scenario())
    assert started == [short] * 5
    assert raised == [long] * 5
    assert lowered == [long] * 5  # never shorter than a request under way may need
