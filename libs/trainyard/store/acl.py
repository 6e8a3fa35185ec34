"""Redis ACL users: the projections' writers, a reader, and admin.

Every service that runs a projector (admission, placement, health, the
gateway) or keeps state of its own in Redis (health's node records, the
emulator) writes; accounting only reads.  Services are confined to the keys
of their installation's prefix and may not run administrative or dangerous
commands (FLUSHALL, CONFIG, KEYS, SHUTDOWN, ...); only admin (``trainyard
admin rebuild``, tests, the operator) may.  The ``default`` user is off, so
a client without a user is refused.

Passwords are written as SHA-256 hashes (``#<hex>``), so an ACL file holds
no password in the clear."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from trainyard.bus.permissions import BusUser

WRITERS = ("admission", "placement", "health", "gateway", "emulator")
READERS = ("accounting",)

_COMMON = "resetchannels -@all +@connection +ping"
WRITER_RULES = f"{_COMMON} +@read +@write +@keyspace +@scripting +@transaction -@dangerous"
READER_RULES = f"{_COMMON} +@read -@dangerous"
ADMIN_RULES = "~* &* +@all"


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
    lines = ["user default off"]
    for user in users:
        if user.role == "portal":
            continue
        digest = hashlib.sha256(user.password.encode()).hexdigest()
        lines.append(f"user {user.name} on #{digest} {rules_for(user.role, prefix)}")
    return "\n".join(lines) + "\n"
