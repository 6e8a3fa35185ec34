"""``python -m trainyard.bus config --out deploy/bus``: the users, passwords
and server files of a locked bus for compose.yaml (or any deployment).

Writes ``credentials.json`` (every password), ``nats.conf`` (users and
permissions, for ``nats-server -c``), ``redis.acl`` (for ``redis-server
--aclfile``) and ``<service>.env`` (each service's ``TRAINYARD_NATS_USER``,
``..._PASSWORD``, ``TRAINYARD_REDIS_USER``, ``..._PASSWORD``).  Passwords
already in ``--out`` are kept unless ``--rotate`` is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainyard.local.credentials import ensure_credentials, new_credentials, write_deploy_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainyard.bus", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="write the users, passwords and server files of a locked bus")
    config.add_argument("--out", type=Path, default=Path("deploy/bus"), help="directory to write (default deploy/bus)")
    config.add_argument(
        "--portal",
        action="append",
        default=[],
        metavar="TENANT",
        help="a tenant whose submission portal gets a NATS user (may repeat)",
    )
    config.add_argument("--cluster", default="local", help="the cluster the emulator's user may publish nodes for")
    config.add_argument(
        "--redis-prefix", default="ty:", help="the Redis key prefix services use (TRAINYARD_REDIS_PREFIX)"
    )
    config.add_argument("--rotate", action="store_true", help="new passwords for every user")
    args = parser.parse_args(argv)
    try:
        credentials = new_credentials(args.portal) if args.rotate else ensure_credentials(args.out, args.portal)
        written = write_deploy_files(args.out, credentials, args.redis_prefix, args.cluster)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(
        f"{len(credentials.nats)} NATS users, {len(credentials.redis)} Redis users; keep {args.out} private.",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
