"""Who is calling: a verified :class:`Principal` with one role, and the two
ways a request is refused (not authenticated, not allowed)."""

from __future__ import annotations

import re
from enum import StrEnum

import msgspec

#: Tenant names and token names: safe as a subject token and in a file name.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Role(StrEnum):
    RESEARCHER = "researcher"  # submits and watches its tenant's jobs
    TENANT_ADMIN = "tenant-admin"  # a researcher who also manages its tenant's tokens
    OPERATOR = "operator"  # runs the fleet: every job and node
    FINANCE = "finance"  # usage, chargeback and capacity for every tenant; changes nothing
    ADMIN = "admin"  # everything


#: Roles bound to exactly one tenant; every other role is bound to none.
TENANT_BOUND = frozenset({Role.RESEARCHER, Role.TENANT_ADMIN})
ROLE_NAMES = ", ".join(r.value for r in Role)


class Unauthenticated(Exception):
    """No credentials, or credentials that do not verify: HTTP 401 / UNAUTHENTICATED.
    The message says what is wrong with them."""


class PermissionDenied(Exception):
    """A verified caller whose role may not do this: HTTP 403 / PERMISSION_DENIED."""


class Principal(msgspec.Struct, frozen=True):
    subject: str  # token: "<id>:<name>"; jwt: the "sub" claim
    role: Role
    tenant: str | None  # set exactly when the role is tenant-bound
    method: str  # how it was authenticated: "token" or "jwt"

    @property
    def actor(self) -> str:
        """The name audit records carry: ``token:<id>:<name>`` or ``jwt:<sub>``."""
        return f"{self.method}:{self.subject}"

    def __str__(self) -> str:
        scope = f" of tenant {self.tenant!r}" if self.tenant else ""
        return f"{self.actor} ({self.role.value}{scope})"


def parse_role(value: object) -> Role:
    """A role from its name; ``ValueError`` naming the roles there are."""
    try:
        return Role(value)  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"{value!r} is not a role; use one of {ROLE_NAMES}") from None


def check_name(what: str, value: str) -> str | None:
    """Why ``value`` cannot be a tenant or token name, or None when it can."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        return f"{what} {value!r}: use 1-64 letters, digits, '_' or '-'"
    return None


def principal(subject: str, role: Role, tenant: str | None, method: str) -> Principal:
    """A principal whose tenant binding fits its role; ``ValueError`` saying what does not."""
    if role in TENANT_BOUND:
        if not tenant:
            raise ValueError(f"the role {role.value} is bound to one tenant: give the tenant")
        problem = check_name("tenant", tenant)
        if problem:
            raise ValueError(problem)
    elif tenant is not None:
        raise ValueError(f"the role {role.value} acts for every tenant: give no tenant")
    return Principal(subject=subject, role=role, tenant=tenant, method=method)
