"""Issue #29.11: the conversation-affinity key over the complete first message.

The key used to hash only the length and both 32 KiB ends of a string over 64 KiB; it now
hashes every character, in slices. This reports, for opening messages of 16 KB to 4 MB, the
key's time beside what the request path already pays for the same body (its `json.loads`)
and beside the sampled key it replaced, measured in one run (ratios, not absolute times,
carry across machines).

    .venv/bin/python bench/affinity_key_cost.py [--output bench/results/affinity_key_cost.md]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date

from sidecar.dialects import conversation
from sidecar.dialects.apis import Dialect

SIZES = (16 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024)


def _sampled_digest(value: str) -> str:
    """The replaced recipe, for the comparison only: length and both 32 Ki ends."""
    digest = hashlib.sha256(str(len(value)).encode())
    digest.update(value[:32 * 1024].encode("utf-8", "surrogatepass"))
    digest.update(value[-32 * 1024:].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _median_ms(work: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(size: int, rounds: int) -> dict[str, float]:
    text = ("def handler(event):\n    return event['id']  # " * (size // 40 + 1))[:size]
    body = json.dumps({"model": "g", "messages": [{"role": "user", "content": text}]}).encode()
    payload = json.loads(body)

    def key() -> object:
        return conversation.conversation_key("caller", "g", Dialect.OPENAI_CHAT, payload)

    full = _median_ms(key, rounds)
    whole = conversation._long_string_digest
    conversation._long_string_digest = _sampled_digest
    try:
        sampled = _median_ms(key, rounds)
    finally:
        conversation._long_string_digest = whole
    parse = _median_ms(lambda: json.loads(body), rounds)
    return {"key_ms": full, "sampled_ms": sampled, "parse_ms": parse}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--output")
    args = parser.parse_args()
    lines = [f"# Affinity key cost ({date.today()}, {platform.python_implementation()} "
             f"{platform.python_version()}, median of {args.rounds})", "",
             "| opening message | key, whole message | key, sampled (before) | "
             "json.loads of the body | key / parse |",
             "| --- | --- | --- | --- | --- |"]
    for size in SIZES:
        row = measure(size, args.rounds)
        lines.append(f"| {size // 1024} KiB | {row['key_ms']:.3f} ms | {row['sampled_ms']:.3f} ms"
                     f" | {row['parse_ms']:.3f} ms | {row['key_ms'] / row['parse_ms']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
