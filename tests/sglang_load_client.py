"""A plain client of a real SGLang server for tests: sends /generate requests from a few threads and
writes hsmon progress events (a `start` naming its servers in `urls`, then `rows`). On an error it
waits and retries, as an extraction waiting on its server does. Runs until killed.

usage: sglang_load_client.py EVENTS JOB URL [OTHER_URL ...] [--threads N] [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.request


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("events")
    p.add_argument("job")
    p.add_argument("urls", nargs="+")
    p.add_argument("--threads", type=int, default=6)
    p.add_argument("--tokens", type=int, default=24)
    a = p.parse_args()
    lock = threading.Lock()
    done = [0]
    out = open(a.events, "a", encoding="utf-8")  # noqa: SIM115

    def emit(kind: str, **fields: object) -> None:
        with lock:
            out.write(json.dumps({"v": 1, "ts": time.time(), "job": a.job, "kind": kind, **fields}) + "\n")
            out.flush()

    emit("start", pid=os.getpid(), rows_total=100000, backend="sglang", urls=a.urls)
    body = json.dumps({"input_ids": list(range(3, 67)),
                       "sampling_params": {"max_new_tokens": a.tokens, "ignore_eos": True}}).encode()

    def worker() -> None:
        while True:
            req = urllib.request.Request(a.urls[0] + "/generate", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    resp.read()
            except OSError:
                time.sleep(0.5)
                continue
            with lock:
                done[0] += 1
                n = done[0]
            emit("rows", rows_done=n, tokens_done=n * 64)

    for _ in range(a.threads):
        threading.Thread(target=worker, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
