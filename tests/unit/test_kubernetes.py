"""deploy/kubernetes: every manifest is valid against the Kubernetes schemas
(kubernetes-validate, strict), and the pod agrees with the sidecar: its command lines are
real `sidecar` commands, the ports, probes and mounts match the addresses and files the
rendered Envoy configuration uses, and the routing configuration it ships loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sidecar.commands.arguments import parser
from sidecar.config import load_config_file
from sidecar.envoy_config.addresses import split_host_port
from sidecar.envoy_config.readiness import READY_PATH

BASE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base"
OVERLAY = BASE.parent / "overlays" / "production"
KUBERNETES_VERSION = "1.33.0"


def resources() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    found = {}
    for name in kustomization["resources"]:
        document = yaml.safe_load((BASE / name).read_text())
        found[document["kind"]] = document
    return found


@pytest.mark.parametrize("kind", ["Deployment", "Service", "PodDisruptionBudget",
                                  "HorizontalPodAutoscaler"])
def test_each_manifest_is_schema_valid(kind: str) -> None:
    kubernetes_validate.validate(resources()[kind], KUBERNETES_VERSION, strict=True)


def test_the_generated_configmap_holds_a_routing_config_that_loads(tmp_path: Path) -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    generator, = kustomization["configMapGenerator"]
    key, _, source = generator["files"][0].partition("=")
    assert key == "config.yaml" and kustomization["generatorOptions"][
        "disableNameSuffixHash"] is True  # a fixed name: edits reload, not roll
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": generator["name"]},
                  "data": {key: (BASE / source).read_text()}}
    kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)
    load_config_file(BASE / source)


def pod() -> dict[str, Any]:
    return resources()["Deployment"]["spec"]["template"]["spec"]


def containers() -> dict[str, dict[str, Any]]:
    spec = pod()
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def flags(container: dict[str, Any]) -> dict[str, Any]:
    return vars(parser().parse_args(container["args"]))  # a real `sidecar` command line


def test_the_pod_agrees_with_the_rendered_envoy_configuration() -> None:
    named = containers()
    render, serve = flags(named["render-envoy"]), flags(named["sidecar"])
    assert (render["command"], serve["command"]) == ("render-envoy", "serve")
    # Envoy reaches the sidecar where it listens, and the sidecar Envoy's admin.
    assert split_host_port(render["ext_proc"])[1] == split_host_port(serve["listen"])[1]
    assert serve["envoy_admin"] == render["admin"]
    assert serve["xds_dir"] == render["xds_dir"]
    assert serve["grpc_token_file"] == render["grpc_token_file"]
    assert serve["config"] == render["config"]
    # Ports, probes and the Service follow the listener and the ext_proc port.
    listen_port = split_host_port(render["listen"])[1]
    grpc_port = split_host_port(serve["listen"])[1]
    sidecar, envoy = named["sidecar"], named["envoy"]
    assert sidecar["ports"][0]["containerPort"] == grpc_port
    assert sidecar["readinessProbe"]["grpc"]["port"] == grpc_port
    assert envoy["ports"][0]["containerPort"] == listen_port
    admin_port = split_host_port(render["admin"])[1]
    assert f"/dev/tcp/127.0.0.1/{admin_port}" in envoy["livenessProbe"]["exec"]["command"][2]
    # Readiness is the client listener's /ready, which the preStop fails before draining.
    assert envoy["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": "http"}
    pre_stop = envoy["lifecycle"]["preStop"]["exec"]["command"][2]
    assert f"/dev/tcp/127.0.0.1/{admin_port}" in pre_stop
    assert pre_stop.index("/healthcheck/fail") < pre_stop.index("/drain_listeners?graceful")
    assert envoy["args"][envoy["args"].index("-c") + 1] == str(render["output"])
    service = resources()["Service"]["spec"]["ports"][0]
    assert service["targetPort"] == envoy["ports"][0]["name"]
    # Admin endpoints stay on loopback: never published.
    assert split_host_port(render["admin"])[0] == "127.0.0.1"
    assert split_host_port(serve["admin_http"])[0] == "127.0.0.1"


def test_mounts_exist_and_carry_what_each_container_reads() -> None:
    spec = pod()
    volumes = {v["name"]: v for v in spec["volumes"]}
    named = containers()
    for container in named.values():
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes, (container["name"], mount["name"])

    def mounted(container: str, path: str) -> bool:
        return any(path == m["mountPath"] or path.startswith(m["mountPath"] + "/")
                   for m in named[container]["volumeMounts"])

    render, serve = flags(named["render-envoy"]), flags(named["sidecar"])
    for path in (render["output"], render["xds_dir"], render["secrets_dir"]):
        assert mounted("render-envoy", str(path)) and mounted("envoy", str(path))
    assert mounted("sidecar", str(serve["config"])) and mounted("sidecar", str(serve["xds_dir"]))
    # Every provider key file the routing config names is mounted where Envoy reads it.
    config = load_config_file(BASE / "routing-config.yaml")
    for provider in config.providers.values():
        if provider.credential is not None and provider.credential.file is not None:
            assert mounted("envoy", str(provider.credential.file))


def test_every_container_is_hardened_and_bounded() -> None:
    spec = pod()
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in containers().values():
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert "memory" in container["resources"]["limits"]
    # Long enough for the sidecar's drain and Envoy's.
    drain = flags(containers()["sidecar"])["drain_seconds"]
    assert spec["terminationGracePeriodSeconds"] > drain


def test_the_overlay_builds_on_the_base() -> None:
    overlay = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert (OVERLAY / overlay["resources"][0]).resolve() == BASE
    names = {r["metadata"]["name"] for r in resources().values()}
    assert {r["name"] for r in overlay["replicas"]} <= names
    images = {c["image"].split(":")[0] for c in containers().values()}
    assert {i["name"] for i in overlay["images"]} <= images
