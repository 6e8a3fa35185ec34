"""Checks of a decoded tenancy configuration, each naming the spot to fix."""

from __future__ import annotations

from trainyard.config.tenancy import ConfigError, QuotaLimits, TenancyConfig, allowed_classes
from trainyard.domain.job import GPU_TYPE_RE
from trainyard.domain.limits import NAME_RE
from trainyard.shapes import did_you_mean

ORDERS = ("las", "fifo")  # scheduling.order: least attained service, or submission order


def validate_tenancy(cfg: TenancyConfig) -> list[ConfigError]:
    """Every problem in ``cfg``; an empty list means it is usable."""
    errors: list[ConfigError] = []

    def err(path: str, message: str) -> None:
        errors.append(ConfigError(path, message))

    # 1. Flavors and priority classes.
    flavors: set[str] = set()
    for i, f in enumerate(cfg.flavors):
        where = f"flavors[{i}]"
        if not GPU_TYPE_RE.match(f.name):
            err(f"{where}.name", f"{f.name!r} is not a GPU type name (letters, digits, '_', '-')")
        if f.name in flavors:
            err(f"{where}.name", f"flavor {f.name!r} is declared twice")
        flavors.add(f.name)
        if not f.node_pool:
            err(f"{where}.node_pool", "name the node pool that holds this GPU type")
        if f.gpus_per_node <= 0:
            err(f"{where}.gpus_per_node", f"must be greater than 0, got {f.gpus_per_node}")
    if not cfg.flavors:
        err("flavors", "declare at least one GPU flavor")
    classes: set[str] = set()
    for i, c in enumerate(cfg.priority_classes):
        where = f"priority_classes[{i}]"
        _name(c.name, f"{where}.name", err)
        if c.name in classes:
            err(f"{where}.name", f"priority class {c.name!r} is declared twice")
        classes.add(c.name)
        if c.may_only_borrow and not c.preemptible:
            err(f"{where}.preemptible", "a class that may only borrow must be preemptible: lenders take it back")
    if cfg.default_priority_class not in classes:
        err(
            "default_priority_class",
            f"unknown priority class {cfg.default_priority_class!r}; {_known(classes, cfg.default_priority_class)}",
        )
    # 2. Settings.
    if cfg.fair_share.half_life_s <= 0:
        err("fair_share.half_life_s", f"must be greater than 0, got {cfg.fair_share.half_life_s}")
    p = cfg.preemption
    for field in (
        "min_runtime_s",
        "grace_period_s",
        "max_fair_share_preemptions",
        "restart_cost_s",
        "attained_service_min_runtime_s",
    ):
        if getattr(p, field) < 0:
            err(f"preemption.{field}", f"must not be negative, got {getattr(p, field)}")
    if p.rate_window_s <= 0:
        err("preemption.rate_window_s", f"must be greater than 0, got {p.rate_window_s}")
    s = cfg.scheduling
    if s.order not in ORDERS:
        err("scheduling.order", f"unknown order {s.order!r}; known: {', '.join(ORDERS)}")
    levels = s.service_levels_gpu_h
    for i, level in enumerate(levels):
        if not level > 0:
            err(f"scheduling.service_levels_gpu_h[{i}]", f"must be greater than 0, got {level}")
        elif i and not level > levels[i - 1]:
            err(
                f"scheduling.service_levels_gpu_h[{i}]",
                f"levels must rise: {level} is not above the level before it, {levels[i - 1]}",
            )
    if not s.reserve_after_s >= 0:
        err("scheduling.reserve_after_s", f"must be 0 or more seconds, got {s.reserve_after_s}")
    if not s.starvation_s > 0:
        err("scheduling.starvation_s", f"must be greater than 0, got {s.starvation_s}")
    # 3. The tree: names, weights, quotas, children within parents.
    org_names: set[str] = set()
    team_names: dict[str, str] = {}  # team -> where first declared
    for o, org in enumerate(cfg.organisations):
        where = f"organisations[{o}]"
        _name(org.name, f"{where}.name", err)
        if org.name in org_names:
            err(f"{where}.name", f"organisation {org.name!r} is declared twice")
        org_names.add(org.name)
        _node(where, org.weight, org.quota, flavors, err)
        for t, team in enumerate(org.teams):
            twhere = f"{where}.teams[{t}]"
            _name(team.name, f"{twhere}.name", err)
            if team.name in team_names:
                err(
                    f"{twhere}.name",
                    f"team {team.name!r} is already declared at {team_names[team.name]}; "
                    "team names are tenant names and must be unique across organisations",
                )
            team_names.setdefault(team.name, twhere)
            _node(twhere, team.weight, team.quota, flavors, err)
            _grants(f"{twhere}.priority_classes", team.priority_classes, None, classes, err)
            queue_names: set[str] = set()
            for q, queue in enumerate(team.queues):
                qwhere = f"{twhere}.queues[{q}]"
                _name(queue.name, f"{qwhere}.name", err)
                if queue.name in queue_names:
                    err(f"{qwhere}.name", f"team {team.name!r} already has a queue {queue.name!r}")
                queue_names.add(queue.name)
                _node(qwhere, queue.weight, queue.quota, flavors, err)
                if queue.default_priority_class is not None and queue.default_priority_class not in classes:
                    err(
                        f"{qwhere}.default_priority_class",
                        f"unknown priority class {queue.default_priority_class!r}; "
                        f"{_known(classes, queue.default_priority_class)}",
                    )
                _grants(f"{qwhere}.priority_classes", queue.priority_classes, team.priority_classes, classes, err)
                allowed = allowed_classes(cfg, team, queue)
                default = queue.default_priority_class or cfg.default_priority_class
                if default in classes and default not in allowed:
                    where_default = "default_priority_class" if queue.default_priority_class else "priority_classes"
                    err(
                        f"{qwhere}.{where_default}",
                        f"the queue's default priority class {default!r} is not one it may use "
                        f"({', '.join(allowed) or 'none'}); grant it in priority_classes or choose another default",
                    )
            _children_fit(twhere, "team", team.quota, "queues", [x.quota for x in team.queues], flavors, err)
        _children_fit(where, "organisation", org.quota, "teams", [x.quota for x in org.teams], flavors, err)
    return errors


def _grants(path: str, granted: list[str] | None, within: list[str] | None, classes: set[str], err) -> None:
    """A team's or queue's list of the priority classes it may use."""
    if granted is None:
        return
    if not granted:
        err(path, "list at least one priority class, or leave priority_classes out")
    seen: set[str] = set()
    for i, name in enumerate(granted):
        if name not in classes:
            err(f"{path}[{i}]", f"unknown priority class {name!r}; {_known(classes, name)}")
        elif name in seen:
            err(f"{path}[{i}]", f"priority class {name!r} is listed twice")
        elif within is not None and name not in within:
            err(f"{path}[{i}]", f"the team may not use priority class {name!r}, so none of its queues may")
        seen.add(name)


def _known(names: set[str], given: str | None = None) -> str:
    """The names to choose from: the nearest to ``given`` first, when one is near."""
    hint = did_you_mean(given, names).removeprefix("; ") + " " if given is not None else ""
    return hint.lstrip() + "known: " + (", ".join(sorted(names)) if names else "none")


def _name(value: str, path: str, err) -> None:
    if not NAME_RE.match(value or ""):
        err(path, f"{value!r} is not a valid name: 1-63 lowercase letters, digits, '.', '_' or '-'")


def _node(where: str, weight: float, quota: dict[str, QuotaLimits], flavors: set[str], err) -> None:
    if not weight > 0:
        err(f"{where}.weight", f"must be greater than 0, got {weight}")
    for f, q in quota.items():
        qwhere = f"{where}.quota.{f}"
        if f not in flavors:
            err(qwhere, f"unknown flavor {f!r}; {_known(flavors, f)}")
        if q.nominal < 0:
            err(f"{qwhere}.nominal", f"must not be negative, got {q.nominal}")
        if q.borrowing_limit is not None and q.borrowing_limit < 0:
            err(f"{qwhere}.borrowing_limit", f"must not be negative, got {q.borrowing_limit}")
        if q.lending_limit is not None:
            if q.lending_limit < 0:
                err(f"{qwhere}.lending_limit", f"must not be negative, got {q.lending_limit}")
            elif q.lending_limit > q.nominal:
                err(
                    f"{qwhere}.lending_limit",
                    f"{q.lending_limit} is more than the nominal quota {q.nominal}; a node can only lend what it has",
                )


def _children_fit(
    where: str,
    kind: str,
    quota: dict[str, QuotaLimits],
    children: str,
    child_quotas: list[dict[str, QuotaLimits]],
    flavors: set[str],
    err,
) -> None:
    totals: dict[str, int] = {}
    for cq in child_quotas:
        for f, q in cq.items():
            if f in flavors:  # unknown flavors are reported where they are named
                totals[f] = totals.get(f, 0) + max(q.nominal, 0)
    for f, total in totals.items():
        own = quota[f].nominal if f in quota else 0
        if total > own:
            err(
                f"{where}.quota.{f}.nominal",
                f"the {children}' nominal {f} quotas add up to {total}, more than the {kind}'s {own}",
            )
