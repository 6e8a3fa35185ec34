"""The authorization table: which role may do which action, and for which
tenants.  Pure: no I/O, no clock; the gateway asks it on every request.

A tenant-bound role (researcher, tenant-admin) acts only inside its own
tenant.  Naming another tenant is refused (403); another tenant's job is
treated as absent (404), so a caller cannot learn which job ids other
tenants use.  Every other role acts for every tenant.
"""

from __future__ import annotations

from enum import StrEnum

from trainyard.auth.principal import TENANT_BOUND, PermissionDenied, Principal, Role


class Action(StrEnum):
    JOB_SUBMIT = "job.submit"
    JOB_READ = "job.read"
    JOB_LIST = "job.list"
    JOB_CANCEL = "job.cancel"
    NODE_LIST = "node.list"
    NODE_HISTORY = "node.history"
    NODE_OPERATE = "node.operate"  # cordon, drain, uncordon
    USAGE_READ = "usage.read"
    CHARGEBACK_EXPORT = "chargeback.export"
    CAPACITY_READ = "capacity.read"
    METRICS_READ = "metrics.read"
    DLQ_READ = "dlq.read"  # list and show dead letters
    DLQ_REPLAY = "dlq.replay"  # publish a dead letter's message again
    TOKEN_ADMIN = "token.admin"  # create, list and revoke API tokens
    TENANCY_READ = "tenancy.read"  # the quota tree, fair-share standing and tenancy revisions


class Scope(StrEnum):
    OWN = "own tenant"  # only the principal's tenant
    ALL = "every tenant"  # any tenant, or the whole fleet


#: What each action is, in the words a refusal uses.
DESCRIPTIONS: dict[Action, str] = {
    Action.JOB_SUBMIT: "submit jobs",
    Action.JOB_READ: "read jobs",
    Action.JOB_LIST: "list jobs",
    Action.JOB_CANCEL: "cancel jobs",
    Action.NODE_LIST: "list nodes",
    Action.NODE_HISTORY: "read node health history",
    Action.NODE_OPERATE: "cordon, drain or uncordon nodes",
    Action.USAGE_READ: "read GPU usage",
    Action.CHARGEBACK_EXPORT: "export chargeback",
    Action.CAPACITY_READ: "read the capacity report",
    Action.METRICS_READ: "read metrics",
    Action.DLQ_READ: "read dead letters",
    Action.DLQ_REPLAY: "replay dead letters",
    Action.TOKEN_ADMIN: "manage API tokens",
    Action.TENANCY_READ: "read the quota tree and tenancy history",
}

_OWN, _ALL = Scope.OWN, Scope.ALL
_JOBS_OWN = {Action.JOB_SUBMIT: _OWN, Action.JOB_READ: _OWN, Action.JOB_LIST: _OWN, Action.JOB_CANCEL: _OWN}

#: role -> action -> scope.  An action missing from a role's row is refused.
POLICY: dict[Role, dict[Action, Scope]] = {
    Role.RESEARCHER: {**_JOBS_OWN, Action.NODE_LIST: _ALL, Action.USAGE_READ: _OWN},
    Role.TENANT_ADMIN: {**_JOBS_OWN, Action.NODE_LIST: _ALL, Action.USAGE_READ: _OWN, Action.TOKEN_ADMIN: _OWN},
    Role.OPERATOR: {
        Action.JOB_READ: _ALL,
        Action.JOB_LIST: _ALL,
        Action.JOB_CANCEL: _ALL,
        Action.NODE_LIST: _ALL,
        Action.NODE_HISTORY: _ALL,
        Action.NODE_OPERATE: _ALL,
        Action.METRICS_READ: _ALL,
        Action.DLQ_READ: _ALL,
        Action.DLQ_REPLAY: _ALL,
    },
    Role.FINANCE: {
        Action.NODE_LIST: _ALL,
        Action.USAGE_READ: _ALL,
        Action.CHARGEBACK_EXPORT: _ALL,
        Action.CAPACITY_READ: _ALL,
    },
    Role.ADMIN: dict.fromkeys(Action, _ALL),
}

#: Roles a tenant-admin may hand out, always inside its own tenant.
TENANT_ADMIN_GRANTS = frozenset({Role.RESEARCHER, Role.TENANT_ADMIN})


def scope_of(role: Role, action: Action) -> Scope | None:
    """The tenants ``role`` may do ``action`` for, or None when it may not."""
    return POLICY[role].get(action)


def roles_allowed(action: Action) -> list[Role]:
    return [role for role in Role if action in POLICY[role]]


def authorize(who: Principal, action: Action) -> Scope:
    """The scope ``who`` has for ``action``; :class:`PermissionDenied` saying
    which roles may, when its role may not."""
    scope = scope_of(who.role, action)
    if scope is None:
        allowed = ", ".join(r.value for r in roles_allowed(action))
        raise PermissionDenied(f"{who} may not {DESCRIPTIONS[action]}; that needs one of the roles: {allowed}")
    return scope


def tenant_filter(who: Principal, action: Action, named: str | None) -> str | None:
    """The tenant a request acts for: the named one (None: every tenant) for an
    unbound role; the principal's own for a tenant-bound one, which may not
    name another tenant."""
    if authorize(who, action) is Scope.ALL:
        return named
    if named is not None and named != who.tenant:
        raise PermissionDenied(f"{who} acts only for tenant {who.tenant!r}, not for {named!r}")
    return who.tenant


def may_see(who: Principal, action: Action, tenant: str) -> bool:
    """Whether ``who`` may do ``action`` on one thing owned by ``tenant`` (a
    job, a token).  Callers answer "not found" when it may not."""
    scope = authorize(who, action)
    return scope is Scope.ALL or tenant == who.tenant


def check_grant(who: Principal, role: Role, tenant: str | None) -> None:
    """Whether ``who`` may create a token with ``role`` for ``tenant``: an
    admin any; a tenant-admin researchers and tenant-admins of its own tenant."""
    if authorize(who, Action.TOKEN_ADMIN) is Scope.ALL:
        return
    if role not in TENANT_ADMIN_GRANTS:
        grants = " or ".join(sorted(r.value for r in TENANT_ADMIN_GRANTS))
        raise PermissionDenied(f"{who} may create only {grants} tokens, not {role.value}")
    if tenant != who.tenant:
        raise PermissionDenied(f"{who} may create tokens only for tenant {who.tenant!r}, not for {tenant!r}")


def is_tenant_bound(role: Role) -> bool:
    return role in TENANT_BOUND
