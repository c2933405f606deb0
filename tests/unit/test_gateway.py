"""The gateway without Envoy: authentication, errors per dialect, and upstream rewrites."""

from __future__ import annotations

import hashlib
import json

import pytest

from sidecar.config import load_config_text
from sidecar.dialects.apis import Dialect
from sidecar.gateway import Forward, Gateway, Pending, Reply, Runtime, StartupError

TOKEN = "tok-123"
CONFIG = load_config_text(f"""
providers:
  local: {{base_url: "http://127.0.0.1:9/prefix/v1", credential: {{env: LOCAL_KEY}}}}
  anth: {{base_url: "http://127.0.0.1:9/v1", dialects: [anthropic_messages],
          credential: {{env: ANTH_KEY}}}}
  keyless: {{base_url: "http://127.0.0.1:9/v1"}}
  both: {{base_url: "http://127.0.0.1:9/oa/v1", dialects: [openai_chat, openai_responses,
          anthropic_messages], credential: {{env: LOCAL_KEY}},
          dialect_base_urls: {{anthropic_messages: "http://127.0.0.1:9/an/v1"}}}}
callers:
  - name: a
    token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}
    models: [g, c, k, multi, pinned, dyn]
models:
  g: {{targets: [{{provider: local, model_ref: real-model}}]}}
  c: {{targets: [{{provider: anth, model_ref: claude-x}}]}}
  k: {{targets: [{{provider: keyless, model_ref: open-model}}]}}
  hidden: {{targets: [{{provider: local, model_ref: secret-model}}]}}
  multi: {{targets: [{{provider: both, model_ref: any-api}}]}}
  pinned: {{targets: [{{provider: both, model_ref: chat-only, api: openai_chat}}]}}
  dyn:
    strategy: dynamic_score
    targets: [{{provider: both, model_ref: d1}}, {{provider: both, model_ref: d2}}]
""")
ENV = {"LOCAL_KEY": "provider-key", "ANTH_KEY": "anth-key"}


@pytest.fixture
def gateway() -> Gateway:
    return Gateway(Runtime(CONFIG, ENV))


def headers(path: str, method: str = "POST", **extra: str) -> dict[str, str]:
    return {":path": path, ":method": method, "authorization": f"Bearer {TOKEN}", **extra}


def forward(gateway: Gateway, path: str, body: dict, **extra: str) -> Forward:
    pending = gateway.on_headers(headers(path, **extra), end_of_stream=False)
    assert isinstance(pending, Pending)
    outcome = gateway.on_body(pending, json.dumps(body).encode())
    assert isinstance(outcome, Forward), outcome
    return outcome


def test_forward_rewrites_model_path_and_cluster_and_carries_no_key(gateway: Gateway) -> None:
    outcome = forward(gateway, "/v1/chat/completions?x=1", {"model": "g", "messages": []})
    sets = dict(outcome.set_headers)
    assert json.loads(outcome.body) == {"model": "real-model", "messages": []}
    assert sets[":path"] == "/prefix/v1/chat/completions"
    # One target: a second try at it, on the route that retries only 5xx and resets.
    assert outcome.attempts == ("target__g__0__local", "target__g__0__local")
    assert sets["x-sidecar-route-class"] == "s" and sets["x-envoy-max-retries"] == "1"
    assert sets["content-length"] == str(len(outcome.body))
    # Envoy injects the key per target cluster; the sidecar never sets one.
    assert not {"authorization", "x-api-key"} & set(sets)


def test_the_sidecar_holds_no_provider_key() -> None:
    """Regression (issue 13, finding 1): any peer of the gRPC port could get a key in a
    header mutation. The runtime is now built without reading keys at all."""
    runtime = Runtime(CONFIG, ENV)
    assert not any(key in repr(vars(runtime)) for key in ENV.values())


def test_anthropic_target_gets_a_version(gateway: Gateway) -> None:
    outcome = forward(gateway, "/v1/messages", {"model": "c", "max_tokens": 5, "messages": []})
    sets = dict(outcome.set_headers)
    assert sets["anthropic-version"] == "2023-06-01"
    kept = forward(gateway, "/v1/messages", {"model": "c", "messages": []},
                   **{"anthropic-version": "2024-01-01"})
    assert "anthropic-version" not in dict(kept.set_headers)


@pytest.mark.parametrize(("path", "upstream"), [
    ("/v1/chat/completions", "/oa/v1/chat/completions"),
    ("/v1/responses", "/oa/v1/responses"),
    ("/v1/messages", "/an/v1/messages"),
])
def test_a_target_serves_every_dialect_its_provider_speaks(
    gateway: Gateway, path: str, upstream: str
) -> None:
    outcome = forward(gateway, path, {"model": "multi"})
    sets = dict(outcome.set_headers)
    assert sets[":path"] == upstream
    # Responses requests take the target's response-processing cluster (unary upstream).
    suffix = "__from_openai_responses" if path == "/v1/responses" else ""
    assert outcome.attempts[0] == "target__multi__0__both" + suffix


def test_a_pinned_api_limits_the_target_to_that_dialect(gateway: Gateway) -> None:
    assert dict(forward(gateway, "/v1/chat/completions", {"model": "pinned"}).set_headers)
    pending = gateway.on_headers(headers("/v1/responses"), end_of_stream=False)
    status, body = reply(gateway.on_body(pending, b'{"model": "pinned"}'))
    assert status == 400 and "openai_responses" in body["error"]["message"]


def test_lone_surrogate_is_forwarded_untouched_and_bad_json_is_400(gateway: Gateway) -> None:
    pending = gateway.on_headers(headers("/v1/chat/completions"), end_of_stream=False)
    raw = b'{"model":"g","messages":[{"role":"user","content":"\\ud83d"}]}'
    outcome = gateway.on_body(pending, raw)
    assert isinstance(outcome, Forward)
    assert outcome.body == raw.replace(b'"g"', b'"real-model"')
    deep = b'{"model":"g","x":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    for bad, message in ((b'{"model":"g","x":NaN}', "not valid JSON"), (deep, "nested")):
        status, body = reply(gateway.on_body(pending, bad))
        assert status == 400
        assert message in body["error"]["message"]


def test_explicit_authorization_header_still_gets_the_bearer_prefix() -> None:
    from sidecar.config.models import Credential
    from sidecar.dialects.apis import Dialect
    from sidecar.header_policy import credential_header

    assert credential_header(Credential(env="K", header="authorization"),
                             Dialect.OPENAI_CHAT) == ("authorization", "Bearer ")
    assert credential_header(Credential(env="K", header="api-key"),
                             Dialect.OPENAI_CHAT) == ("api-key", "")
    assert credential_header(Credential(env="K", header="authorization", prefix="Api-Key "),
                             Dialect.OPENAI_CHAT) == ("authorization", "Api-Key ")
    assert credential_header(Credential(env="K"), Dialect.ANTHROPIC_MESSAGES) == (
        "x-api-key", "")


def test_affinity_applies_to_dynamic_groups_and_skips_stateful_sessions(gateway: Gateway):
    chat = {"model": "dyn", "messages": [{"role": "user", "content": "hi"}]}
    first = forward(gateway, "/v1/chat/completions", chat)
    assert first.decision.trace.affinity == "miss_created"
    assert forward(gateway, "/v1/chat/completions", chat).decision.trace.affinity == "hit"
    session = forward(gateway, "/v1/chat/completions", chat, **{"x-session-id": "s-1"})
    assert session.decision.trace.affinity == "not_applicable"
    stateful = {"model": "dyn", "input": "hi", "previous_response_id": "resp_1"}
    assert forward(gateway, "/v1/responses", stateful).decision.trace.affinity == (
        "not_applicable")
    weighted = {"model": "g", "messages": [{"role": "user", "content": "hi"}]}
    assert forward(gateway, "/v1/chat/completions", weighted).decision.trace.affinity == (
        "not_applicable")


def test_caller_headers_reach_providers_only_by_allowlist(gateway: Gateway) -> None:
    """Regression (issue 13, finding 10): only five named headers were stripped."""
    from sidecar.extproc import messages

    caller = headers("/v1/chat/completions", cookie="session=abc", **{
        "x-custom-token": "t", "x-api-key": "caller-key", "x-envoy-max-retries": "9",
        "content-type": "application/json", "user-agent": "sdk", "anthropic-beta": "b",
        "x-forwarded-for": "10.0.0.1", "openai-organization": "org"})
    removed = set(messages.continue_headers(caller, gateway.forwarded_headers)
                  .request_headers.response.header_mutation.remove_headers)
    assert removed == {"authorization", "cookie", "x-custom-token", "x-api-key",
                       "x-envoy-max-retries", "x-forwarded-for", "openai-organization"}
    outcome = forward(gateway, "/v1/chat/completions", {"model": "k"})
    assert all(TOKEN not in value for _, value in outcome.set_headers)


def test_a_providers_pass_request_headers_extend_the_allowlist() -> None:
    from sidecar.header_policy import cluster_stripped_headers, forwarded_request_headers

    config = load_config_text("""
providers:
  a: {base_url: "http://127.0.0.1:9/v1", pass_request_headers: [X-Trace]}
  b: {base_url: "http://127.0.0.1:9/v1"}
models:
  g: {targets: [{provider: a, model_ref: m}, {provider: b, model_ref: m}]}
""")
    assert "x-trace" in forwarded_request_headers(config)
    # b's cluster removes it (and every cluster the header only Envoy's routing needs)
    assert cluster_stripped_headers(config, "b") == ("x-forwarded-proto", "x-sidecar-route-class",
                                                   "x-trace")
    assert cluster_stripped_headers(config, "a") == ("x-forwarded-proto", "x-sidecar-route-class")


def test_x_api_key_authenticates_too(gateway: Gateway) -> None:
    pending = gateway.on_headers({":path": "/v1/messages", ":method": "POST", "x-api-key": TOKEN},
                                 end_of_stream=False)
    assert isinstance(pending, Pending) and pending.dialect is Dialect.ANTHROPIC_MESSAGES


def reply(outcome: object) -> tuple[int, dict]:
    assert isinstance(outcome, Reply), outcome
    return outcome.status, json.loads(outcome.body)


def test_models_list_is_answered_from_config(gateway: Gateway) -> None:
    status, body = reply(gateway.on_headers(headers("/v1/models", "GET"), True))
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["g", "c", "k", "multi", "pinned", "dyn"]
    status, body = reply(gateway.on_headers(
        headers("/v1/models", "GET", **{"anthropic-version": "2023-06-01"}), True))
    assert body["data"][0] == {"type": "model", "id": "g", "display_name": "g",
                               "created_at": "1970-01-01T00:00:00Z"}
    assert reply(gateway.on_headers(headers("/v1/models/g", "GET"), True))[1]["id"] == "g"
    assert reply(gateway.on_headers(headers("/v1/models/hidden", "GET"), True))[0] == 404


@pytest.mark.parametrize(("hdrs", "status", "fragment"), [
    ({":path": "/v1/chat/completions", ":method": "POST"}, 401, "Missing API key"),
    ({":path": "/v1/chat/completions", ":method": "POST", "authorization": "Bearer nope"},
     401, "not known"),
    ({":path": "/v1/chat/completions", ":method": "POST", "authorization": "Basic abc"},
     401, "Missing API key"),
    (headers("/v1/chat/completions", "GET"), 405, "use POST"),
    (headers("/v1/models", "POST"), 405, "use GET"),
    (headers("/v1/nothing"), 404, "Unknown endpoint"),
])
def test_header_phase_errors(gateway: Gateway, hdrs: dict, status: int, fragment: str) -> None:
    code, body = reply(gateway.on_headers(hdrs, end_of_stream=False))
    assert code == status and fragment in body["error"]["message"]


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (b"{", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[]", 400, "must be a JSON object"),
    (b"{}", 400, "'model'"),
    (b'{"model": 7}', 400, "'model'"),
    (b'{"model": "hidden"}', 404, "does not exist or you do not have access"),
    (b'{"model": "nope"}', 404, "does not exist or you do not have access"),
    (b'{"model": "c"}', 400, "openai_chat"),
])
def test_body_phase_errors(gateway: Gateway, body: bytes, status: int, fragment: str) -> None:
    pending = gateway.on_headers(headers("/v1/chat/completions"), end_of_stream=False)
    code, payload = reply(gateway.on_body(pending, body))
    assert code == status and fragment in payload["error"]["message"]


def test_anthropic_callers_get_anthropic_errors(gateway: Gateway) -> None:
    pending = gateway.on_headers(headers("/v1/messages"), end_of_stream=False)
    code, payload = reply(gateway.on_body(pending, b'{"model": "hidden"}'))
    assert code == 404
    assert payload == {"type": "error", "error": {
        "type": "not_found_error",
        "message": "The model 'hidden' does not exist or you do not have access to it."}}


def test_missing_keys_are_named_only_by_where_they_were_expected() -> None:
    from sidecar.gateway.runtime import provider_key_problems

    assert provider_key_problems(CONFIG, {"LOCAL_KEY": "provider-key"}) == [
        "providers.anth.credential.env: environment variable ANTH_KEY is not set or empty"]
    assert provider_key_problems(CONFIG, ENV) == []


def test_missing_caller_tokens_stop_start_up() -> None:
    config = load_config_text("""
callers: [{name: a, token_env: NO_SUCH_TOKEN_VAR}]
models: {g: {targets: [{provider: local, model_ref: m}]}}
providers: {local: {base_url: "http://127.0.0.1:9/v1"}}
""")
    with pytest.raises(StartupError) as caught:
        Runtime(config, {})
    assert caught.value.problems == [
        "callers[0].token_env: environment variable NO_SUCH_TOKEN_VAR is not set or empty "
        "(caller 'a')"]


def test_fallback_order_is_cut_to_max_attempts_and_stateful_responses_get_none(
        gateway: Gateway) -> None:
    outcome = forward(gateway, "/v1/responses", {"model": "dyn", "input": "hi"})
    # Two targets, max_attempts 3: d1, d2, d1 (round them again: fallback_policy.py).
    assert len(outcome.attempts) == 3 and outcome.attempts[0] == outcome.attempts[2]
    assert dict(outcome.set_headers)["x-envoy-max-retries"] == "2"
    continued = forward(gateway, "/v1/responses",
                        {"model": "dyn", "input": "hi", "previous_response_id": "resp_1"})
    assert len(continued.attempts) == 1
    assert dict(continued.set_headers)["x-envoy-max-retries"] == "0"


def test_max_attempts_one_turns_fallback_off() -> None:
    config = load_config_text(f"""
providers: {{local: {{base_url: "http://127.0.0.1:9/v1", credential: {{env: LOCAL_KEY}}}}}}
callers: [{{name: a, token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]
models:
  one:
    fallback: {{max_attempts: 1}}
    targets: [{{provider: local, model_ref: m1}}, {{provider: local, model_ref: m2}}]
""")
    outcome = forward(Gateway(Runtime(config, ENV)), "/v1/chat/completions",
                      {"model": "one", "messages": []})
    assert len(outcome.attempts) == 1
    assert dict(outcome.set_headers)["x-envoy-max-retries"] == "0"


def test_a_retry_after_a_reload_is_rewritten_by_the_configuration_it_was_decided_with() -> None:
    """Issue #28 (docs/reload.md §3): a request under way finishes on its own configuration;
    its retry used the new configuration's model_ref."""
    two = """
providers: {{a: {{base_url: "http://127.0.0.1:9/v1"}}, b: {{base_url: "http://127.0.0.1:8/v1"}}}}
callers: [{{name: a, token_sha256: {digest}}}]
models: {{g: {{strategy: failover, targets: [{{provider: a, model_ref: first}},
                                             {{provider: b, model_ref: {ref}}}]}}}}
"""
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    old = Runtime(load_config_text(two.format(digest=digest, ref="old-ref")), {})
    gateway = Gateway(old)
    decided = forward(gateway, "/v1/chat/completions", {"model": "g", "messages": []})
    generation = dict(decided.set_headers)["x-sidecar-generation"]
    assert generation == old.generation
    new = Runtime(load_config_text(two.format(digest=digest, ref="new-ref")), {})
    gateway.swap(new, None, None)
    retry = {":path": "/v1/chat/completions", "x-sidecar-generation": generation}
    route = gateway.on_attempt_headers(decided.attempts[1], retry)
    assert not isinstance(route, Reply) and route.model_ref == "old-ref"
    fresh_retry = gateway.on_attempt_headers(decided.attempts[1], {
        ":path": "/v1/chat/completions", "x-sidecar-generation": new.generation})
    assert fresh_retry.model_ref == "new-ref"  # type: ignore[union-attr]
    unknown = gateway.on_attempt_headers(decided.attempts[1], {":path": "/v1/chat/completions"})
    assert unknown.model_ref == "new-ref"  # type: ignore[union-attr]  # the newest knows it
