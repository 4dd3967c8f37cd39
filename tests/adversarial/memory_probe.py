"""Run as a script: parse and count one 30 MB chat body of a given kind, and print what it cost
as JSON: {"body_mb", "peak_mb" (peak RSS over the RSS with the body's bytes held), "cpu_s", "tokens"}.
Arguments: kind, size in MB, model (gpt-4o), and `gzip` to hold the body gzipped and inflate it
first, as the server does with a compressed upload (`body_mb` is then the inflated size).

Run in a process of its own so that its peak RSS is its own (Linux: /proc/self/clear_refs resets it).
"""

from __future__ import annotations

import gc
import json
import random
import sys
import time
import zlib
from pathlib import Path

from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelRegistry
from proxy.core.plan import BodyError
from proxy.server.edge.body import inflate_within
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers
from proxy.wire.codec import loads_strict

SAMPLES = "tests/data/samples/"


def text_of(kind: str, size: int) -> str:
    if kind == "prose":
        base = Path(SAMPLES, "english.txt").read_text(encoding="utf-8")
    elif kind == "cjk":
        base, size = Path(SAMPLES, "chinese.txt").read_text(encoding="utf-8"), size // 3  # 3 bytes a character
    elif kind == "a-repeated":
        base = " a" * 4096
    elif kind == "random-letters":
        base = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz", k=1 << 20))
    elif kind == "whitespace":
        base = " \t" * 4096
    else:
        raise SystemExit(f"unknown kind {kind}")
    return (base * (size // len(base) + 1))[:size]


def megabytes(key: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise RuntimeError(key)


def main(kind: str, size_mb: float, model: str, gzipped: bool) -> None:
    profile = ModelRegistry(load_model_map()).profile(model)
    # With the count cache the server uses: its key hashes each long text's UTF-8 bytes (a copy).
    counter = RequestCounter(profile, Tokenizers().get(profile.tokenizer), CountCache())
    counter.request({"messages": [{"role": "user", "content": "warm up"}]})
    size = int(size_mb * 1024 * 1024)
    if kind.startswith("dense-json"):  # `[],` in a field the guard does not read; `-spaced`: at the density allowed
        unit = b"[]," + b" " * 45 if kind.endswith("-spaced") else b"[],"
        head = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()[:-1]
        body = head + b', "unread": [' + unit * (size // len(unit)) + b"0]}"
    else:
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": text_of(kind, size)}]}, ensure_ascii=False
        ).encode()
    size = len(body)
    if gzipped:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        body = compressor.compress(body) + compressor.flush()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak RSS starts again from here
    held = megabytes("VmRSS")
    started = time.process_time()
    try:
        count = counter.request(loads_strict(inflate_within(body, "gzip", size) if gzipped else body))
    except BodyError as refused:
        tokens, notes = None, [f"refused: {refused}"]
    else:
        tokens, notes = count.total, list(count.notes)
    cpu = time.process_time() - started
    peak = megabytes("VmHWM") - held
    print(json.dumps({"body_mb": size / 2**20, "peak_mb": peak, "cpu_s": cpu, "tokens": tokens, "notes": notes}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "gpt-4o", "gzip" in sys.argv[4:])
