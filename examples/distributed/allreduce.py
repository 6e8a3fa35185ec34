#!/usr/bin/env python3
"""A distributed job with nothing but the standard library: a TCP rendezvous and
an all-reduce over Trainyard's environment contract (docs/execution.md).

Every rank reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.  Rank 0 listens on
MASTER_ADDR:MASTER_PORT, the others connect to it (retrying while it starts).  Each
step every rank contributes ``(rank + 1) * (step + 1)``; rank 0 sums the values and
sends the sum back, and every rank checks it against the closed form, so a wrong
rank or world size fails loudly.

Checkpoints: every ``--checkpoint-every`` steps rank 0 writes the step it reached
to ``$TRAINYARD_CHECKPOINT_DIR/trainyard-step`` (written to a temporary file and
renamed, so a reader never sees half a number); the node agent reports it and the
next attempt starts with ``TRAINYARD_RESUME_STEP`` set to it.

Stopping: on the stop signal (``TRAINYARD_STOP_SIGNAL``, SIGTERM by default) each
rank finishes the step it is in; the round's answer tells every rank to stop, rank
0 saves a checkpoint, and all exit 0.

Usage: python3 allreduce.py [--steps N] [--step-seconds S] [--checkpoint-every K]
                            [--fail-rank R --fail-at-step T]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import sys
import time

_ROUND = struct.Struct("!qq")  # (value, stopping) from a rank; (sum, stop) back from rank 0


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            sys.exit(f"allreduce: {name} is not set; run this under Trainyard or set it by hand")
        return default
    return int(value)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("a peer closed the connection")
        data += chunk
    return data


def _save(step: int) -> None:
    folder = os.environ.get("TRAINYARD_CHECKPOINT_DIR")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".trainyard-step.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{step}\n")
    os.replace(tmp, os.path.join(folder, "trainyard-step"))
    print(f"checkpoint saved at step {step}", flush=True)


def _rendezvous(rank: int, world: int, addr: str, port: int, timeout_s: float = 120.0) -> list[socket.socket]:
    """Rank 0: a socket per other rank, in rank order.  Others: one socket to rank 0."""
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        server = socket.create_server((addr, port), reuse_port=False)
        server.settimeout(timeout_s)
        peers: dict[int, socket.socket] = {}
        while len(peers) < world - 1:
            conn, _ = server.accept()
            conn.settimeout(None)
            (peer_rank,) = struct.unpack("!q", _recv_exact(conn, 8))
            peers[peer_rank] = conn
        server.close()
        return [peers[r] for r in sorted(peers)]
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=5.0)
            sock.settimeout(None)
            sock.sendall(struct.pack("!q", rank))
            return [sock]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-seconds", type=float, default=0.5)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--fail-rank", type=int, default=-1, help="this rank exits 3 at --fail-at-step (a test of failure)")
    ap.add_argument("--fail-at-step", type=int, default=-1)
    args = ap.parse_args()

    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_int("MASTER_PORT")
    start = _env_int("TRAINYARD_RESUME_STEP", 0)
    stopping = False

    def _on_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    stop_signal = getattr(signal, os.environ.get("TRAINYARD_STOP_SIGNAL", "SIGTERM"), signal.SIGTERM)
    signal.signal(stop_signal, _on_stop)
    print(
        f"rank {rank} of {world} (local rank {os.environ.get('LOCAL_RANK', '?')}, "
        f"GPUs {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}) starting at step {start}",
        flush=True,
    )
    peers = _rendezvous(rank, world, addr, port)
    expected_base = world * (world + 1) // 2
    step = start
    while step < args.steps:
        if rank == args.fail_rank and step == args.fail_at_step:
            print(f"rank {rank}: failing at step {step} as asked", file=sys.stderr, flush=True)
            sys.stdout.flush()
            # At once, as a crash would: the peers see the connection drop only as this process dies,
            # so it ends before the peers that fail because of it (a return would close the sockets
            # first, and the interpreter's shutdown could outlast the peers' own failures).
            os._exit(3)
        value = (rank + 1) * (step + 1)
        if rank == 0:
            total, stop = value, stopping
            rounds = [_ROUND.unpack(_recv_exact(p, _ROUND.size)) for p in peers]
            for v, s in rounds:
                total += v
                stop = stop or bool(s)
            for p in peers:
                p.sendall(_ROUND.pack(total, int(stop)))
        else:
            peers[0].sendall(_ROUND.pack(value, int(stopping)))
            total, stop_flag = _ROUND.unpack(_recv_exact(peers[0], _ROUND.size))
            stop = bool(stop_flag)
        if total != expected_base * (step + 1):
            print(f"rank {rank}: step {step} sum {total} != {expected_base * (step + 1)}", file=sys.stderr, flush=True)
            return 2
        print(f"step {step}: all-reduce sum={total} ok", flush=True)
        step += 1
        if rank == 0 and (stop or step % args.checkpoint_every == 0 or step == args.steps):
            _save(step)
        if stop:
            print(f"rank {rank}: stopping after step {step - 1} as asked", flush=True)
            return 0
        time.sleep(args.step_seconds)
    print(f"rank {rank}: done, {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
