"""The built-in simulated workload: what a process whose ``argv`` is empty runs.

A step is one second of work and the job is ``--duration`` seconds of it:
it starts at ``--resume-step`` (so a resumed run does only what is left),
writes the step it reached into ``<checkpoint-dir>/trainyard-step`` every
``--checkpoint-every`` seconds and at the end, and on SIGTERM (or
``--stop-signal``) writes a checkpoint and exits 0 at once.

The agent starts it as ``python -I -S workload.py ...`` (this file, by path),
filling the options from the launch's environment
(``TRAINYARD_SIMULATED_DURATION_S``, ``TRAINYARD_SIMULATED_CHECKPOINT_S``,
``TRAINYARD_CHECKPOINT_DIR``, ``TRAINYARD_RESUME_STEP``,
``TRAINYARD_STOP_SIGNAL``): it imports nothing but the standard library, so it
starts in a few milliseconds.  ``python -m trainyard.agent.workload --help``
works too.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

STEP_FILE = "trainyard-step"


def write_step(checkpoint_dir: str, step: int) -> None:
    """Write ``step`` into the step file atomically (write, then rename)."""
    path = os.path.join(checkpoint_dir, STEP_FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{step}\n")
    os.replace(tmp, path)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainyard-workload", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds of work")
    p.add_argument("--checkpoint-every", type=float, default=0.0, help="seconds between checkpoints (0: none)")
    p.add_argument("--checkpoint-dir", default="", help="where the step file is written")
    p.add_argument("--resume-step", type=int, default=0, help="the step to start from")
    p.add_argument("--stop-signal", default="SIGTERM", help="the signal that asks for a checkpoint and exit")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for name in {"SIGTERM", args.stop_signal}:
        signal.signal(getattr(signal, name), lambda *_: stop.set())
    started = time.monotonic()
    step0: int = args.resume_step
    last_checkpoint = started
    left = max(0.0, args.duration - step0)
    print(f"simulated workload: {left:g}s of {args.duration:g}s left, from step {step0}", flush=True)

    def step() -> int:
        return min(step0 + int(time.monotonic() - started), max(step0, int(args.duration)))

    while not stop.is_set():
        now = time.monotonic()
        if now - started >= left:
            break
        if args.checkpoint_dir and args.checkpoint_every > 0 and now - last_checkpoint >= args.checkpoint_every:
            write_step(args.checkpoint_dir, step())
            last_checkpoint = now
        stop.wait(min(0.2, max(0.0, left - (now - started))))
    if args.checkpoint_dir and (stop.is_set() or args.checkpoint_every > 0):
        write_step(args.checkpoint_dir, step())
    print(f"simulated workload: {'stopped' if stop.is_set() else 'done'} at step {step()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(parse(sys.argv[1:])))
