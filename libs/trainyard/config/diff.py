"""What changed between two tenancy configurations, in words an admin reads."""

from __future__ import annotations

from typing import Any

import msgspec

from trainyard.config.tenancy import QuotaLimits, TenancyConfig


def _settings(prefix: str, struct: msgspec.Struct, out: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    for field in struct.__struct_fields__:
        if field not in skip:
            out[f"{prefix} {field}"] = getattr(struct, field)


def _quota(prefix: str, quota: dict[str, QuotaLimits], out: dict[str, Any]) -> None:
    for f, q in quota.items():
        out[f"{prefix} {f} nominal"] = q.nominal
        out[f"{prefix} {f} borrowing_limit"] = "unlimited" if q.borrowing_limit is None else q.borrowing_limit
        out[f"{prefix} {f} lending_limit"] = "all" if q.lending_limit is None else q.lending_limit


def _flatten(cfg: TenancyConfig) -> tuple[dict[str, Any], list[str]]:
    """Every setting under a readable key, and the entities in declaration order."""
    out: dict[str, Any] = {}
    entities: list[str] = []
    for f in cfg.flavors:
        entities.append(f"flavor {f.name}")
        _settings(f"flavor {f.name}", f, out, ("name",))
    for c in cfg.priority_classes:
        entities.append(f"priority class {c.name}")
        _settings(f"priority class {c.name}", c, out, ("name",))
    out["default_priority_class"] = cfg.default_priority_class
    _settings("fair_share", cfg.fair_share, out)
    _settings("preemption", cfg.preemption, out)
    _settings("scheduling", cfg.scheduling, out)
    for org in cfg.organisations:
        o = f"organisation {org.name}"
        entities.append(o)
        out[f"{o} weight"] = org.weight
        _quota(f"{o} quota", org.quota, out)
        for team in org.teams:
            t = f"team {org.name}/{team.name}"
            entities.append(t)
            out[f"{t} weight"] = team.weight
            _quota(f"{t} quota", team.quota, out)
            for queue in team.queues:
                q = f"queue {team.name}/{queue.name}"
                entities.append(q)
                out[f"{q} weight"] = queue.weight
                out[f"{q} default_priority_class"] = queue.default_priority_class or "(cluster default)"
                _quota(f"{q} quota", queue.quota, out)
    return out, entities


def diff_tenancy(old: TenancyConfig, new: TenancyConfig) -> list[str]:
    """One line per change: entities added or removed, then settings changed."""
    before, old_entities = _flatten(old)
    after, new_entities = _flatten(new)
    old_set, new_set = set(old_entities), set(new_entities)
    gone = [e for e in old_entities if e not in new_set]
    born = [e for e in new_entities if e not in old_set]
    lines = [f"removed {e}" for e in gone] + [f"added {e}" for e in born]
    whole = tuple(e + " " for e in gone + born)  # settings of these are covered by their line

    keys = list(before) + [k for k in after if k not in before]
    for key in keys:
        if key.startswith(whole):
            continue
        if key not in after:
            lines.append(f"{key}: {before[key]} -> (not set)")
        elif key not in before:
            lines.append(f"{key}: (not set) -> {after[key]}")
        elif before[key] != after[key]:
            lines.append(f"{key}: {before[key]} -> {after[key]}")
    return lines
