"""The soak's hidden test knob (grpcwire/time_scale.py): `SIDECAR_TEST_TIME_SCALE` speeds up
the gRPC server's durations and Envoy's health checks of the sidecar together, and nothing
else; unset, the rendered bootstrap and the limits are the production ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sidecar.config import load_config_file
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import render_envoy_yaml
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.time_scale import TIME_SCALE_ENV, scaled_limits, time_scale

SPEC = Path(__file__).parent.parent / "fixtures" / "spec_sample.yaml"


def test_the_scale_is_one_unless_set_and_a_bad_value_is_an_error() -> None:
    assert time_scale({}) == 1.0
    assert time_scale({TIME_SCALE_ENV: " "}) == 1.0
    assert time_scale({TIME_SCALE_ENV: "10"}) == 10.0
    for bad in ("0.5", "0", "-3", "fast", "1e9"):
        with pytest.raises(ValueError, match=TIME_SCALE_ENV):
            time_scale({TIME_SCALE_ENV: bad})


def test_only_the_durations_scale() -> None:
    limits = ServerLimits.for_message_size(33 * 1024 * 1024)
    scaled = scaled_limits(limits, 10)
    assert (scaled.handshake_timeout, scaled.idle_timeout, scaled.open_method_timeout,
            scaled.log_interval) == (0.5, 30.0, 0.2, 6.0)
    unchanged = {name: getattr(limits, name) for name in limits.__slots__
                 if name not in ("handshake_timeout", "idle_timeout", "open_method_timeout",
                                 "log_interval")}
    assert {name: getattr(scaled, name) for name in unchanged} == unchanged
    assert scaled_limits(limits, 1.0) is limits


def _ext_proc_cluster() -> dict:
    document = yaml.safe_load(render_envoy_yaml(load_config_file(SPEC), EnvoyAddresses()))
    cluster, = (c for c in document["static_resources"]["clusters"]
                if c["name"] == "sidecar_ext_proc")
    return cluster


def _idle_timeout(cluster: dict) -> str:
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    return options["common_http_protocol_options"]["idle_timeout"]


def test_envoys_health_checks_and_idle_timeout_follow_the_scale(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIME_SCALE_ENV, raising=False)
    check, = (cluster := _ext_proc_cluster())["health_checks"]
    assert (check["interval"], check["no_traffic_interval"], check["timeout"]) == (
        "1s", "1s", "1s")
    assert _idle_timeout(cluster) == "240s"  # before the sidecar's 300 s
    monkeypatch.setenv(TIME_SCALE_ENV, "10")
    check, = (cluster := _ext_proc_cluster())["health_checks"]
    # the interval scales, the timeout does not (a deadline on the sidecar's answer)
    assert (check["interval"], check["no_traffic_interval"], check["timeout"]) == (
        "0.100s", "0.100s", "1s")
    assert _idle_timeout(cluster) == "24s"  # before the sidecar's scaled 30 s
