#!/usr/bin/env python3
"""What the estimate's cache check costs (`evalsup estimate --cache DIR`, a run's start line): every hit's entry
read and checked as the run checks it (``cache.keep.entry_unfit``: its body parsed) against the key look-up
alone (``SELECT key, completion_tokens``, what the estimate did before), and the whole estimate for scale.

N chat tasks, all in the cache, answers of ``--response-kb`` KiB; CPU time of this process (``process_time``:
the host is shared), best of ``--repeat``. In-process, no endpoint.

    scripts/bench_estimate_cache.py                  # N=100000, 1 KiB answers
    scripts/bench_estimate_cache.py --n 20000 --response-kb 16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalsup.cache.key import KeyMaker  # noqa: E402
from evalsup.cache.known import BATCH, KnownAnswers, request_key  # noqa: E402
from evalsup.cache.store import Entry, Store  # noqa: E402
from evalsup.config.prices import load_prices  # noqa: E402
from evalsup.tasks.requests import RequestDefaults  # noqa: E402
from evalsup.tools.estimate import estimate  # noqa: E402

D = RequestDefaults(model="m", max_tokens=100)


def keys_only(known: KnownAnswers, keys: list[bytes]) -> int:
    """The look-up before the check: keys and completion tokens, no body read."""
    assert known.store is not None
    n = 0
    for i in range(0, len(keys), BATCH):
        part = keys[i:i + BATCH]
        n += len(known.store.conn.execute(
            f"SELECT key, completion_tokens FROM entries WHERE key IN ({','.join('?' * len(part))})", part
        ).fetchall())
    return n


def best(f: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        f()  # type: ignore[operator]
        times.append(time.process_time() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--response-kb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        tasks = d / "tasks.jsonl"
        objs = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0}
                for i in range(a.n)]
        tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
        text = "x" * int(a.response_kb * 1024)
        body = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}})
        km = KeyMaker()
        keys = [request_key(km, o, D)[0] for o in objs]
        s = Store(d / "cache")
        for i in range(0, a.n, 10_000):
            s.put([Entry(k, body, 200, None, "m", "/v1/chat/completions", 3, 20) for k in keys[i:i + 10_000]])
        s.close()
        known = KnownAnswers(d / "cache")
        paths = ["/v1/chat/completions"] * a.n
        bare = best(lambda: keys_only(known, keys), a.repeat)
        checked = best(lambda: known.completion_tokens(keys, paths), a.repeat)
        assert len(known.completion_tokens(keys, paths)[0]) == a.n
        known.close()
        prices = load_prices(self_hosted=True)
        whole = best(lambda: estimate(tasks, prices, D, cache_dir=d / "cache"), a.repeat)
    print(f"{a.n:,} hits, {a.response_kb:g} KiB answers (CPU s, best of {a.repeat}):")
    print(f"  key look-up alone      {bare:7.3f}")
    per_hit = (checked - bare) / a.n * 1e6
    print(f"  look-up and check      {checked:7.3f}  ({checked / bare:.1f}x; +{per_hit:.1f} us a hit)")
    print(f"  the whole estimate     {whole:7.3f}  (the check's extra {(checked - bare) / whole:.0%} of it)")


if __name__ == "__main__":
    main()
