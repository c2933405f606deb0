"""The sidecar's CPU per access-log entry, in process (issue #32): what reading one routed
request's entry costs, from the decoded message to the observation store and the quota
ledger's check.

The entry has the shape Envoy 1.40 sends for a routed 1 KB chat request of the SPEC group
(captured from `bench/profile_under_load.py`'s stack on 2026-12-03 and rebuilt here field
by field: addresses, the eight timings, the usage and attempt-order metadata, one logged
response header), 18 entries per message as Envoy batched them under load.

Usage:  .venv/bin/python bench/access_log_cost.py [--entries 30000]
"""

from __future__ import annotations

import argparse
import time

from bench_processes import TOKEN
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2
from envoy_pieces import config_with_keys

from sidecar.config import load_config_text
from sidecar.envoy_contract import ROUTE_NAMESPACE, USAGE_NAMESPACE
from sidecar.gateway import Runtime
from sidecar.observe.access_log import AccessLogReceiver, FanOut
from sidecar.observe.store import ObservationStore
from sidecar.quotas.admission import Quotas

PER_MESSAGE = 18
TIMINGS_NS = {  # what Envoy measured for one request through the fast provider
    "time_to_last_rx_byte": 106_660, "time_to_first_upstream_tx_byte": 3_053_026,
    "time_to_last_upstream_tx_byte": 3_057_474, "time_to_first_upstream_rx_byte": 3_704_818,
    "time_to_last_upstream_rx_byte": 3_722_371, "time_to_first_downstream_tx_byte": 3_774_219,
    "time_to_last_downstream_tx_byte": 3_779_348, "duration": 3_781_302}


def entry(clusters: list[str], serial: int) -> al.HTTPAccessLogEntry:
    message = al.HTTPAccessLogEntry()
    common = message.common_properties
    for name, port in (("downstream_remote_address", 55654), ("downstream_local_address", 35173),
                       ("upstream_remote_address", 60013), ("upstream_local_address", 34168),
                       ("downstream_direct_remote_address", 55654)):
        address = getattr(common, name).socket_address
        address.address, address.port_value = "127.0.0.1", port
    common.start_time.FromNanoseconds(1_796_313_930_619_071_000 + serial)
    for name, nanos in TIMINGS_NS.items():
        getattr(common, name).FromNanoseconds(nanos)
    common.upstream_cluster = clusters[0]
    common.metadata.filter_metadata[USAGE_NAMESPACE].update({
        "usage_missing": "true", "shape": "chat.completion", "output_tokens": 10,
        "input_tokens": 250})
    common.metadata.filter_metadata[ROUTE_NAMESPACE].update({"priority_groups": [
        {"name": f"attempt{n}", "clusters": [{"cluster_name": cluster, "weight": 1}]}
        for n, cluster in enumerate(clusters, 1)]})
    common.upstream_request_attempt_count = 1
    common.stream_id = f"92dae77e-49ba-4095-a785-{serial:012d}"
    common.downstream_wire_bytes_sent, common.downstream_wire_bytes_received = 396, 1177
    common.upstream_wire_bytes_sent, common.upstream_wire_bytes_received = 1221, 396
    common.access_log_type = al.DownstreamEnd
    message.protocol_version = al.HTTPAccessLogEntry.HTTP11
    request = message.request
    request.request_method = 3  # POST
    request.scheme, request.authority, request.path = "http", "127.0.0.1", "/v1/chat/completions"
    request.request_id = common.stream_id
    request.request_headers_bytes, request.request_body_bytes = 216, 998
    response = message.response
    response.response_code.value = 200
    response.response_headers_bytes, response.response_body_bytes = 99, 272
    response.response_headers["content-type"] = "application/json"
    response.response_code_details = "via_upstream"
    return message


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=30_000)
    args = parser.parse_args()
    config = load_config_text(config_with_keys(9, "http://127.0.0.1:9/v1", TOKEN))
    runtime = Runtime(config, {"BENCH_PROVIDER_KEY": "k"})
    clusters = list(runtime.cluster_targets)[:3]
    messages = []
    for first in range(0, args.entries, PER_MESSAGE):
        message = als_pb2.StreamAccessLogsMessage()
        message.http_logs.log_entry.extend(entry(clusters, first + n) for n in range(PER_MESSAGE))
        messages.append(message.SerializeToString())
    store = ObservationStore.for_config(config)
    receiver = AccessLogReceiver(store, runtime.cluster_targets, runtime.cluster_groups,
                                 attempt_window_s=100.0,
                                 telemetry=FanOut([Quotas(config, 100.0).ledger]))
    runs = []
    for _ in range(6):
        started = time.process_time()
        for payload in messages:
            receiver.stream().on_message(None, payload)  # type: ignore[arg-type]
        runs.append((time.process_time() - started) / (len(messages) * PER_MESSAGE) * 1e6)
    runs = sorted(runs[1:])  # the first run warms up
    print(f"access-log entry: {runs[len(runs) // 2]:.1f} µs of CPU per entry (median of "
          f"{len(runs)} runs of {len(messages) * PER_MESSAGE} entries; "
          f"range {runs[0]:.1f}–{runs[-1]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
