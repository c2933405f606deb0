"""Reloading the routing configuration without a restart (docs/reload.md).

Triggered by SIGHUP, by a change of the configuration file, or by `POST /reload` on the
admin endpoint (admin token required). The new file is loaded and validated exactly as
`check-config --secrets` does (`serve` leaves out the provider keys, which only its Envoy
holds); a file that fails is rejected with the same messages and the
running configuration keeps serving. A valid one is swapped in at once: requests from then
on use it, requests under way finish on theirs (gateway/handler.py, `Pending.runtime`).

What a reload keeps: observations (keyed by target, in the store), the whole routing state
of groups whose configuration did not change, the affinity pins of changed groups to
targets that did not change, sessions, caches of groups whose cache settings did not
change, and quota counts. Sections read only at start — `limits`, `observations`,
`telemetry`, `sessions`, `quotas` — keep their running values until a restart; a reload
that changes them says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.cache.caches import ResponseCaches
from sidecar.config.checks import check_config_file
from sidecar.config.loading import release_freed_memory
from sidecar.config.models import SidecarConfig
from sidecar.config.secrets import SecretError
from sidecar.external.client import ExternalCalls
from sidecar.gateway.runtime import Runtime, StartupError
from sidecar.operations.assembly import longest_request_s

if TYPE_CHECKING:
    from sidecar.operations.assembly import RunningSidecar

log = logging.getLogger("sidecar.reload")

RESTART_ONLY = ("limits", "observations", "telemetry", "sessions", "quotas")


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    trigger: str
    problems: tuple[str, ...] = ()
    # Sections that changed but keep their running values until a restart.
    needs_restart: tuple[str, ...] = ()
    groups: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "trigger": self.trigger, "problems": list(self.problems),
                "needs_restart": list(self.needs_restart), "groups": self.groups}


@dataclass
class Reloader:
    """Reloads `path` into a running sidecar."""

    path: Path
    sidecar: RunningSidecar
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    # Whether the provider keys must be readable here: yes for `sidecar up` (it hands them
    # to its Envoy); no for `serve`, whose Envoy holds keys the sidecar never sees.
    check_keys: bool = True
    # Run before the swap, each may refuse it with a problem: the embedded stack hands
    # Envoy the new clusters there and waits until it has them.
    before_swap: list[Callable[[SidecarConfig], Awaitable[str | None]]] = field(
        default_factory=list)
    outcomes: Counter[tuple[str]] = field(default_factory=Counter)
    last: ReloadResult | None = None
    _stamp: tuple[int, int, int] | None = None
    _one_at_a_time: asyncio.Lock = field(default_factory=asyncio.Lock)
    watcher: asyncio.Task[None] | None = None
    # How long reading and checking may take before the reload is rejected. The file's
    # bounds (config/loading.py) keep that to a few seconds; a stalled filesystem can
    # still hold a read, so its thread is left to finish while later reloads are refused.
    prepare_timeout_s: float = 30.0
    _reading: asyncio.Future[tuple[SidecarConfig, Runtime] | list[str]] | None = None

    def __post_init__(self) -> None:
        self._stamp = _stamp(self.path)

    async def reload(self, trigger: str) -> ReloadResult:
        """Load and check in a worker thread (a large file takes a while; the loop keeps
        serving), then swap on the loop. One reload at a time."""
        async with self._one_at_a_time:
            self._stamp = _stamp(self.path)
            prepared = await self._prepared()
            if not isinstance(prepared, list):
                config, runtime = prepared
                for hook in self.before_swap:
                    problem = await hook(config)
                    if problem is not None:
                        prepared = [problem]
                        break
            if not isinstance(prepared, list):
                running = self.sidecar.gateway.runtime.config
                apply(self.sidecar, config, runtime)
                changed = tuple(name for name in RESTART_ONLY
                                if getattr(config, name) != getattr(running, name))
                result = ReloadResult(True, trigger, needs_restart=changed,
                                      groups=len(config.models))
            else:
                result = ReloadResult(False, trigger, tuple(prepared))
        self.last = result
        self.outcomes[("applied" if result.ok else "rejected",)] += 1
        release_freed_memory()  # what the parse (and a rejected configuration) held
        if result.ok:
            log.info("configuration reloaded (%s): %d model groups%s", trigger, result.groups,
                     f"; needs a restart to change: {', '.join(result.needs_restart)}"
                     if result.needs_restart else "")
        else:
            log.error("configuration reload (%s) rejected; the running configuration stays:"
                      "\n%s", trigger, "\n".join(f"  {p}" for p in result.problems))
        return result

    def changed_on_disk(self) -> bool:
        """Whether the file (or what its path points at now: Kubernetes swaps a ConfigMap
        through a symlink) changed since the last look."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    async def _prepared(self) -> tuple[SidecarConfig, Runtime] | list[str]:
        if self._reading is not None and not self._reading.done():
            return ["the previous reload is still reading the file (a stalled filesystem?); "
                    "try again once it ends"]
        self._reading = asyncio.ensure_future(asyncio.to_thread(self._prepare))
        try:
            return await asyncio.wait_for(asyncio.shield(self._reading),
                                          self.prepare_timeout_s)
        except TimeoutError:
            return [f"reading and checking the file took longer than "
                    f"{self.prepare_timeout_s:g} s (a stalled filesystem?)"]

    def _prepare(self) -> tuple[SidecarConfig, Runtime] | list[str]:
        """The new configuration and its runtime, or every problem (as check-config
        --secrets words them)."""
        try:
            checked = check_config_file(self.path, self.environ, caller_tokens=True,
                                        provider_keys=self.check_keys)
            if checked.config is None:
                return [str(problem) for problem in checked.problems]
            config = checked.config
            runtime = Runtime(config, self.environ)
        except StartupError as exc:  # a token file changed since the check
            return list(exc.problems)
        except (SecretError, OSError, ValueError) as exc:
            return [str(exc)]
        except Exception as exc:  # whatever the file holds, the reload is only rejected
            log.exception("configuration reload: unexpected failure")
            return [f"cannot load the configuration ({type(exc).__name__})"]
        return config, runtime


def apply(sidecar: RunningSidecar, config: SidecarConfig, runtime: Runtime) -> None:
    """Swap `runtime` in, carrying over what still holds (module docstring)."""
    gateway = sidecar.gateway
    runtime.router.carry_over(gateway.runtime.router)
    if gateway.external is not None:
        sidecar.retire(gateway.external)
    # What waits for a request's access-log entries (its attempts, its quota charge, its
    # telemetry row, its cache slot) waits as long as the longest deadline. It only
    # grows: requests started under a longer deadline are still under way.
    window = sidecar.max_request_s = max(sidecar.max_request_s, longest_request_s(config))
    gateway.swap(runtime, ExternalCalls.for_config(config, gateway.external),
                 ResponseCaches.for_config(config, window, gateway.caches))
    if sidecar.receiver is not None:
        sidecar.receiver.remap(runtime.cluster_targets, runtime.cluster_groups, window)
    if gateway.quotas is not None:
        gateway.quotas.reconfigure(config, window)
    if sidecar.telemetry is not None:
        sidecar.telemetry.reconfigure(config.target_prices, window)
    if gateway.canary is not None:
        gateway.canary.max_request_s = window
    if gateway.mirror is not None:
        gateway.mirror.reconfigure(config)
        gateway.mirror.max_request_s = window


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()  # follows symlinks: the file the path names now
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


async def watch(reloader: Reloader, interval_s: float = 2.0) -> None:
    """Reload when the file changes (polled: inotify does not see a ConfigMap's symlink
    swap reliably, and a stat every two seconds costs nothing)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            if reloader.changed_on_disk():
                await reloader.reload("file")
        except Exception:  # the watch must outlive any file (a reload only rejects it)
            log.exception("configuration watch: a reload failed; still watching")


def enable_reload(sidecar: RunningSidecar, path: Path,
                  watch_interval_s: float | None = 2.0, check_keys: bool = True) -> Reloader:
    """Every way in: SIGHUP, the file changing (polled every `watch_interval_s`; None: not
    watched), and the admin endpoint's `POST /reload`. Outcomes in
    `sidecar_config_reloads_total{outcome}`."""
    reloader = Reloader(path, sidecar, check_keys=check_keys)
    sidecar.reloader = reloader
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[object]] = set()

    def on_sighup() -> None:
        task = loop.create_task(reloader.reload("sighup"))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)

    async def by_admin() -> dict[str, object]:
        return (await reloader.reload("admin")).as_dict()

    sidecar.admin.reload = by_admin
    if watch_interval_s is not None:
        reloader.watcher = loop.create_task(watch(reloader, watch_interval_s))
    sidecar.metrics.add_counter("config_reloads", "configuration reloads by outcome "
                                "(applied, rejected)", ("outcome",),
                                lambda: dict(reloader.outcomes))
    return reloader
