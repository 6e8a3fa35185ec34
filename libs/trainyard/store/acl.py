"""Redis ACL users: the projections' writers, a reader, and admin.

Every service that runs a projector (admission, placement, health, the
gateway) or keeps state of its own in Redis (health's node records, the
emulator) writes; accounting only reads.  Services are confined to the keys
of their installation's prefix and may not run administrative or dangerous
commands (FLUSHALL, CONFIG, KEYS, SHUTDOWN, ...) nor administer scripts
(SCRIPT FLUSH or KILL, FUNCTION LOAD or DELETE): they run the folds with
EVALSHA (EVAL, SCRIPT LOAD and SCRIPT EXISTS too, as redis-py may).  Only
admin (``trainyard admin rebuild``, tests, the operator) may do more.

The ``default`` user is off and has no password, so a client without a
user is refused and no client can log in as it.  It still holds every
permission: Redis 7.0 replays its append-only file as ``default``, and a
transaction (MULTI/EXEC, which is also how a script's writes are logged)
that ``default`` may not run is dropped on replay with "-NOPERM ACLs rules
changed between the moment the transaction was accumulated and the EXEC
call", which would lose every fold at each restart.

Passwords are written as SHA-256 hashes (``#<hex>``), so an ACL file holds
no password in the clear."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from trainyard.bus.permissions import BusUser

WRITERS = ("admission", "placement", "health", "gateway", "emulator")
READERS = ("accounting",)

_COMMON = "resetchannels -@all +@connection +ping"
#: No functions (FUNCTION LOAD, FLUSH and DELETE are in @write) and no
#: script administration; last, so no category above grants them back.
NO_SCRIPT_ADMIN = "-function -fcall -fcall_ro -script"
#: The scripting a projection writer needs.
SCRIPT_RULES = f"{NO_SCRIPT_ADMIN} +eval +evalsha +eval_ro +evalsha_ro +script|load +script|exists"
WRITER_RULES = f"{_COMMON} +@read +@write +@keyspace +@transaction -@dangerous {SCRIPT_RULES}"
READER_RULES = f"{_COMMON} +@read -@dangerous {NO_SCRIPT_ADMIN}"
ADMIN_RULES = "~* &* +@all"
#: Off and without a password (nobody logs in as it), but allowed everything:
#: the user Redis replays the append-only file as.
DEFAULT_RULES = f"off resetpass {ADMIN_RULES}"


def rules_for(role: str, prefix: str = "ty:") -> str:
    """The ACL rules (after the password) of ``role``'s Redis user."""
    if role == "admin":
        return ADMIN_RULES
    if role in WRITERS:
        return f"~{prefix}* {WRITER_RULES}"
    if role in READERS:
        return f"~{prefix}* {READER_RULES}"
    raise ValueError(f"{role!r} has no Redis user; roles with one: admin, {', '.join(WRITERS + READERS)}")


def redis_acl(users: Iterable[BusUser], prefix: str = "ty:") -> str:
    """An ACL file (``redis-server --aclfile``) for ``users``; those whose
    role has no Redis user (portals) are left out."""
    lines = [f"user default {DEFAULT_RULES}"]
    for user in users:
        if user.role == "portal":
            continue
        digest = hashlib.sha256(user.password.encode()).hexdigest()
        lines.append(f"user {user.name} on #{digest} {rules_for(user.role, prefix)}")
    return "\n".join(lines) + "\n"
