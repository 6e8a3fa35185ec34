"""The tenancy configuration: who may use which GPUs, and how much.

Declared in YAML (see ``examples/tenancy.yaml``)::

    flavors:            GPU types, each on a node pool
    priority_classes:   name, priority, preemptible, may_only_borrow, restricted
    organisations:      -> teams -> queues, each with a weight and a quota per flavor;
                        teams and queues may list the priority classes their jobs may use
    fair_share:         half_life_s of the decayed usage
    preemption:         which kinds are on, min runtime, grace period, rate limit, restart cost
    scheduling:         backfill, order inside a queue (las or fifo), service levels, aging

A team is a *tenant*: ``JobSpec.tenant`` is a team name (unique across the
cluster) and ``JobSpec.queue`` one of that team's queues.

Which priority classes a queue's jobs may use: the queue's
``priority_classes`` if it lists them, else its team's, else every class that
is not *restricted*.  A class is restricted when it says so, and by default
when it is not preemptible (``production``): GPUs held by a job nobody can
preempt must be granted, not taken.

:func:`load_tenancy` decodes and type-checks; :func:`validate_tenancy` (in
``trainyard.config.validation``) checks the meaning; :func:`compile_tenancy`
turns a valid configuration into the quota tree the admission core uses.
"""

from __future__ import annotations

import msgspec
import yaml

from trainyard.core.admission.intake import validate_against_tenancy as _validate_spec
from trainyard.core.admission.tree import (
    Cohort,
    FlavorQuota,
    PreemptionSettings,
    PriorityClass,
    QueueQuota,
    Scheduling,
    Tenancy,
)
from trainyard.domain.job import JobSpec, ValidationError, error_location
from trainyard.shapes import known_only, shape_problems
from trainyard.yaml_input import YamlTooLarge, check_yaml


class _Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


class QuotaLimits(_Config):
    nominal: int = 0  # GPUs guaranteed to this node
    borrowing_limit: int | None = None  # GPUs beyond nominal it may borrow; absent: no limit
    lending_limit: int | None = None  # unused nominal GPUs siblings may borrow; absent: all of them


class QueueConfig(_Config):
    name: str
    weight: float = 1.0  # fair-share weight among the team's queues
    quota: dict[str, QuotaLimits] = {}
    default_priority_class: str | None = None  # for jobs that name none; absent: the cluster default
    priority_classes: list[str] | None = None  # classes its jobs may use; absent: the team's
    description: str = ""


class TeamConfig(_Config):
    name: str  # the tenant name jobs are submitted under
    weight: float = 1.0
    quota: dict[str, QuotaLimits] = {}
    queues: list[QueueConfig] = []
    priority_classes: list[str] | None = None  # classes its queues may use; absent: the unrestricted ones
    description: str = ""


class OrganisationConfig(_Config):
    name: str
    weight: float = 1.0
    quota: dict[str, QuotaLimits] = {}
    teams: list[TeamConfig] = []
    description: str = ""


class FlavorConfig(_Config):
    name: str  # GPU type as in Role.gpu_type, e.g. H100
    node_pool: str  # the node pool (label value) that holds this type
    gpus_per_node: int = 8
    description: str = ""


class PriorityClassConfig(_Config):
    name: str
    priority: int  # higher goes first within a queue
    preemptible: bool = True
    may_only_borrow: bool = False  # best effort: runs only on capacity others lend
    restricted: bool | None = None  # only queues granted it may use it; absent: restricted unless preemptible
    description: str = ""

    @property
    def is_restricted(self) -> bool:
        return (not self.preemptible) if self.restricted is None else self.restricted


class FairShareConfig(_Config):
    half_life_s: float = 7 * 24 * 3600.0


class PreemptionConfig(_Config):
    within_queue: bool = True
    reclaim: bool = True
    fair_share: bool = True
    min_runtime_s: float = 4 * 3600.0  # fair-share victims have run at least this long (shorter thrashes)
    grace_period_s: float = 300.0  # notice before a victim is stopped, time to checkpoint
    max_fair_share_preemptions: int = 10  # per rate window
    rate_window_s: float = 600.0
    restart_cost_s: float = 300.0  # per GPU: what a stopped run spends getting back; added to its lost work
    attained_service: bool = True  # with order las: a job stops a run that has had more service levels
    attained_service_min_runtime_s: float = 4 * 3600.0  # ... once that run has lasted this long (1 h thrashes)


class SchedulingConfig(_Config):
    backfill: bool = True  # EASY backfill on run-time limits; false: strict order
    reserve: bool = True  # a blocked job holds a reservation (once it has waited reserve_after_s); false: greedy
    reserve_after_s: float = 6 * 3600.0  # how long a job waits before it holds a reservation and may reclaim
    order: str = "las"  # inside a queue after priority: "las" (least attained service) or "fifo"
    service_levels_gpu_h: tuple[float, ...] = (1.0, 64.0, 1024.0)  # attained GPU-hours at which a job moves down
    starvation_s: float = 3 * 24 * 3600.0  # a job waiting longer goes ahead of the service levels


class TenancyConfig(_Config):
    flavors: list[FlavorConfig]
    priority_classes: list[PriorityClassConfig]
    organisations: list[OrganisationConfig]
    default_priority_class: str = "standard"
    fair_share: FairShareConfig = FairShareConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    scheduling: SchedulingConfig = SchedulingConfig()


class ConfigError(msgspec.Struct, frozen=True):
    """One problem in a tenancy configuration: where, and what to fix."""

    path: str  # e.g. organisations[0].teams[1].queues[2].quota.H100.borrowing_limit
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class TenancyConfigError(ValueError):
    """The text could not be read as a tenancy configuration."""

    def __init__(self, errors: list[ConfigError], without_unknown: TenancyConfig | None = None) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors
        # the configuration the text makes once its unknown keys are left out, when that reads:
        # what it means can then be checked in the same pass
        self.without_unknown = without_unknown


def load_tenancy(text: str) -> TenancyConfig:
    """Decode YAML text; raise :class:`TenancyConfigError` naming every key and value that does not fit,
    each with its path (and, for a misspelt key, the nearest declared one)."""
    try:
        check_yaml(text, "the tenancy file")
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except YamlTooLarge as exc:
        raise TenancyConfigError([ConfigError("", str(exc))]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise TenancyConfigError([ConfigError(where, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from exc
    if not isinstance(data, dict):
        raise TenancyConfigError([ConfigError("", "a tenancy configuration is a YAML mapping")])
    try:
        return msgspec.convert(data, TenancyConfig, strict=True)
    except msgspec.ValidationError as exc:
        problems = shape_problems(data, TenancyConfig) or [error_location(exc)[::-1]]
        try:
            rest: TenancyConfig | None = msgspec.convert(known_only(data, TenancyConfig), TenancyConfig, strict=True)
        except msgspec.ValidationError:
            rest = None
        raise TenancyConfigError([ConfigError(path, message) for path, message in problems], rest) from exc


def _quota(limits: dict[str, QuotaLimits]) -> dict[str, FlavorQuota]:
    return {f: FlavorQuota(q.nominal, q.borrowing_limit, q.lending_limit) for f, q in limits.items()}


def allowed_classes(cfg: TenancyConfig, team: TeamConfig, queue: QueueConfig) -> list[str]:
    """The priority classes jobs of ``queue`` may use (see the module's docstring)."""
    if queue.priority_classes is not None:
        return list(queue.priority_classes)
    if team.priority_classes is not None:
        return list(team.priority_classes)
    return [c.name for c in cfg.priority_classes if not c.is_restricted]


def compile_tenancy(cfg: TenancyConfig) -> Tenancy:
    """The quota tree for the admission core: cohorts ``org`` and ``org/team``, queues by team."""
    cohorts: list[Cohort] = []
    queues: list[QueueQuota] = []
    for org in cfg.organisations:
        cohorts.append(Cohort(org.name, None, _quota(org.quota), org.weight))
        for team in org.teams:
            team_cohort = f"{org.name}/{team.name}"
            cohorts.append(Cohort(team_cohort, org.name, _quota(team.quota), team.weight))
            for queue in team.queues:
                classes = tuple(allowed_classes(cfg, team, queue))
                queues.append(
                    QueueQuota(team.name, queue.name, team_cohort, _quota(queue.quota), queue.weight, classes)
                )
    p = cfg.preemption
    return Tenancy(
        queues=queues,
        cohorts=cohorts,
        flavors=[f.name for f in cfg.flavors],
        priority_classes=[
            PriorityClass(c.name, c.priority, c.preemptible, c.may_only_borrow) for c in cfg.priority_classes
        ],
        half_life_s=cfg.fair_share.half_life_s,
        preemption=PreemptionSettings(
            within_queue=p.within_queue,
            reclaim=p.reclaim,
            fair_share=p.fair_share,
            min_runtime_s=p.min_runtime_s,
            grace_period_s=p.grace_period_s,
            fair_share_limit=p.max_fair_share_preemptions,
            fair_share_window_s=p.rate_window_s,
            restart_cost_s=p.restart_cost_s,
            attained_service=p.attained_service,
            attained_service_min_runtime_s=p.attained_service_min_runtime_s,
        ),
        scheduling=Scheduling(
            backfill=cfg.scheduling.backfill,
            reserve=cfg.scheduling.reserve,
            reserve_after_s=cfg.scheduling.reserve_after_s,
            order=cfg.scheduling.order,
            service_levels_gpu_h=tuple(cfg.scheduling.service_levels_gpu_h),
            starvation_s=cfg.scheduling.starvation_s,
        ),
    )


def priority_class_of(cfg: TenancyConfig, spec: JobSpec) -> PriorityClassConfig | None:
    """The class a job runs under (its own, else its queue's default, else the cluster's)."""
    by_name = {c.name: c for c in cfg.priority_classes}
    if spec.priority_class in by_name:
        return by_name[spec.priority_class]
    for org in cfg.organisations:
        for team in org.teams:
            if team.name != spec.tenant:
                continue
            for queue in team.queues:
                if queue.name == spec.queue and queue.default_priority_class in by_name:
                    return by_name[queue.default_priority_class]
    return by_name.get(cfg.default_priority_class)


def validate_against_tenancy(spec: JobSpec, cfg: TenancyConfig | Tenancy) -> list[ValidationError]:
    """Every reason ``spec`` could never run under this configuration; empty when it could."""
    return _validate_spec(spec, compile_tenancy(cfg) if isinstance(cfg, TenancyConfig) else cfg)
