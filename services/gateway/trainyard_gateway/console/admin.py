"""The console page for admins: the quota tree with what each organisation,
team and queue holds now (nominal, in use, borrowed, lent), fair-share
standing (decayed usage against weight), and the tenancy revision history
with what each revision changed."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from nats.js.errors import BadRequestError, KeyNotFoundError, NoKeysError, NotFoundError

from trainyard.auth import Action
from trainyard.bus import Bus
from trainyard.config.diff import diff_tenancy
from trainyard.config.store import BUCKET, TENANCY_KEY
from trainyard.config.tenancy import QuotaLimits, TenancyConfig, TenancyConfigError, load_tenancy
from trainyard.core.admission import queue_key
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads
from trainyard.store.fairshare import FairShareStandings
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import page
from trainyard_gateway.console.session import principal, refusal


def quota_row(
    level: str, name: str, weight: float, quota: dict[str, QuotaLimits], used: dict[str, int], depth: int
) -> dict[str, Any]:
    """One row of the tree: per GPU type, nominal, limits, in use, borrowed beyond nominal,
    and idle nominal others may borrow (lent, up to the lending limit)."""
    flavors = {}
    for gpu_type in sorted(set(quota) | set(used)):
        limits = quota.get(gpu_type, QuotaLimits())
        in_use = used.get(gpu_type, 0)
        idle = max(0, limits.nominal - in_use)
        flavors[gpu_type] = {
            "nominal": limits.nominal,
            "borrowing_limit": limits.borrowing_limit,
            "lending_limit": limits.lending_limit,
            "in_use": in_use,
            "borrowed": max(0, in_use - limits.nominal),
            "lendable": idle if limits.lending_limit is None else min(idle, limits.lending_limit),
        }
    return {"level": level, "name": name, "weight": weight, "flavors": flavors, "depth": depth}


def add(into: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v
    return into


def quota_tree(cfg: TenancyConfig, used: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Rows, organisations first, each followed by its teams and their queues."""
    rows = []
    for org in cfg.organisations:
        org_rows, org_used = [], {}
        for team in org.teams:
            team_used: dict[str, int] = {}
            queue_rows = []
            for queue in team.queues:
                q_used = used.get(queue_key(team.name, queue.name), {})
                add(team_used, q_used)
                queue_rows.append(quota_row("queue", f"{team.name}/{queue.name}", queue.weight, queue.quota, q_used, 2))
            add(org_used, team_used)
            org_rows += [quota_row("team", team.name, team.weight, team.quota, team_used, 1), *queue_rows]
        rows += [quota_row("organisation", org.name, org.weight, org.quota, org_used, 0), *org_rows]
    return rows


def fair_share(cfg: TenancyConfig, usage: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each queue's decayed GPU-hours and its share of them against its share of the weights."""
    weights = {
        queue_key(t.name, q.name): t.weight * q.weight for o in cfg.organisations for t in o.teams for q in t.queues
    }
    total_w = sum(weights.values()) or 1.0
    hours = {k: sum(usage.get(k, {}).values()) / 3600.0 for k in weights}
    total_h = sum(hours.values())
    return [
        {
            "queue": k,
            "weight_share": weights[k] / total_w,
            "gpu_hours": hours[k],
            "usage_share": hours[k] / total_h if total_h else 0.0,
        }
        for k in sorted(weights)
    ]


async def in_use(store: Store) -> dict[str, dict[str, int]]:
    """GPUs by type held by admitted, placed and running jobs, per queue."""
    jobs = await views.get_jobs(store, await views.ids_in(store, "active"), ("queue", "gpus_by_type"))
    used: dict[str, dict[str, int]] = {}
    for job in jobs:
        if job.queue is not None and job.active:
            add(used.setdefault(queue_key(job.tenant, job.queue), {}), job.gpus_by_type)
    return used


async def revisions(bus: Bus) -> list[dict[str, Any]]:
    """Every kept revision of the tenancy, newest first, with what it changed."""
    try:
        kv = await bus.js.key_value(BUCKET)
        entries = await kv.history(TENANCY_KEY)
    except (NotFoundError, BadRequestError, KeyNotFoundError, NoKeysError):  # NoKeysError: the bucket, no tenancy yet
        return []
    out, before = [], None
    for entry in entries:
        if entry.value is None or entry.operation is not None:
            continue
        text = entry.value.decode()
        try:
            cfg = load_tenancy(text)
        except TenancyConfigError as err:
            out.append({"revision": entry.revision, "changes": [f"does not load: {err}"], "text": text})
            continue
        changes = diff_tenancy(before, cfg) if before is not None else ["first tenancy configuration"]
        out.append({"revision": entry.revision, "changes": changes, "text": text, "config": cfg})
        before = cfg
    return list(reversed(out))


def build_router(bus: Bus, store: Store) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    jobs_caught_up = CaughtUpReads(bus, store, streams=("JOBS",))  # what each queue holds: never a half-rebuilt view
    standings = FairShareStandings(store)

    @router.get("/admin/tenancy")
    @answers_rebuilding
    async def tenancy_page(request: Request) -> Response:
        who = principal(request)
        refused = refusal(request, who, Action.TENANCY_READ)
        if refused:
            return refused
        history = await revisions(bus)
        current = next((r for r in history if "config" in r), None)
        if current is None:
            return page(request, "tenancy.html", who, current=None, tree=[], shares=[], history=history)
        cfg = current["config"]
        usage = (await standings.read(time.time())).usage  # as admission last folded the JOBS stream
        return page(
            request,
            "tenancy.html",
            who,
            current=current,
            tree=quota_tree(cfg, await jobs_caught_up.read(lambda: in_use(store))),
            shares=fair_share(cfg, usage),
            history=history,
        )

    return router
