"""A stand-in for `hsmon train` (the real one is built on branch `train`), used only to test
hsmon.launch.training and the daemon's control endpoints: it takes the same leading arguments, writes
start/step/checkpoint events to --events, and on SIGTERM writes a checkpoint and a `stopped`
event, then exits 0.

    python tests/standin_train.py train DATA --out OUT --events FILE [other flags ignored]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from hsmon.contracts import events as ev


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["train"])
    parser.add_argument("data")
    parser.add_argument("--out", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--steps", type=int, default=0)
    args, _rest = parser.parse_known_args()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with ev.EventWriter("train", args.events) as writer:
        writer.emit(ev.START, pid=os.getpid(), data=args.data, argv=sys.argv[1:])
        step = 0
        while not stopping and (args.steps == 0 or step < args.steps):
            step += 1
            loss = [2.0 / step, 2.5 / step]
            writer.emit(
                ev.STEP,
                step=step,
                total_steps=10_000,
                epoch=0,
                loss=sum(loss),
                losses=loss,
                accs=[0.1, 0.05],
                tokens=512 * step,
                tokens_s=5120.0,
            )
            time.sleep(0.1)
        ckpt = os.path.join(args.out, f"ckpt-{step}")
        os.makedirs(ckpt, exist_ok=True)
        writer.emit(ev.CHECKPOINT, step=step, path=ckpt)
        writer.emit(ev.STOPPED if stopping else ev.DONE, step=step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
