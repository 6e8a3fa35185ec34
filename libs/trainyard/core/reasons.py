"""Every reason a job can be waiting or rejected, as one fixed vocabulary."""

from __future__ import annotations

import enum


class PendingReason(str, enum.Enum):
    QUEUED_BEHIND = "queued_behind"  # an earlier job of the same GPU type is waiting
    INSUFFICIENT_GPUS = "insufficient_gpus"  # not enough free GPUs of the type right now
    NO_CAPACITY_OF_TYPE = "no_capacity_of_type"  # the cluster has no GPUs of that type at all
    GANG_LARGER_THAN_CLUSTER = "gang_larger_than_cluster"
    QUOTA = "quota"
    COHORT_EXHAUSTED = "cohort_exhausted"
    FAIR_SHARE = "fair_share"
    GANG_LARGER_THAN_QUOTA = "gang_larger_than_quota"
    FRAGMENTED = "fragmented"  # enough GPUs in total, but no set of nodes holds the gang
    TOPOLOGY = "topology"  # no domain at the required level holds the gang
    RESERVED_FOR_LARGER_JOB = "reserved_for_larger_job"
    BACKOFF = "backoff"
    UNKNOWN_QUEUE = "unknown_queue"  # the tenant or queue is not in the tenancy configuration
    NO_QUOTA_FOR_TYPE = "no_quota_for_type"  # the queue has no quota for the GPU type and cannot borrow any
    PREEMPTING = "preempting"  # running jobs were told to stop to make room for this one
    GANG_LARGER_THAN_DOMAIN = "gang_larger_than_domain"  # no domain at the required level is that large


REASON_TEXT: dict[PendingReason, str] = {
    PendingReason.QUEUED_BEHIND: "waiting behind an earlier job for the same GPU type",
    PendingReason.INSUFFICIENT_GPUS: "not enough free GPUs of this type; will start when running jobs finish",
    PendingReason.NO_CAPACITY_OF_TYPE: "the cluster has no healthy nodes with this GPU type",
    PendingReason.GANG_LARGER_THAN_CLUSTER: "the gang needs more GPUs of this type than the cluster has",
    PendingReason.QUOTA: "the queue's quota is in use",
    PendingReason.COHORT_EXHAUSTED: "the queue's quota and what it may borrow are in use",
    PendingReason.FAIR_SHARE: "other tenants are below their fair share",
    PendingReason.GANG_LARGER_THAN_QUOTA: "the gang is larger than the queue could ever borrow",
    PendingReason.FRAGMENTED: "enough GPUs are free in total but no set of nodes holds every replica",
    PendingReason.TOPOLOGY: "no topology domain at the required level has room for the gang",
    PendingReason.RESERVED_FOR_LARGER_JOB: "the free GPUs are reserved for a larger job that is waiting",
    PendingReason.BACKOFF: "waiting out a retry backoff",
    PendingReason.GANG_LARGER_THAN_DOMAIN: (
        "no topology domain at the required level is large enough for the gang, even when empty; "
        "relax the topology constraint or make the gang smaller"
    ),
    PendingReason.UNKNOWN_QUEUE: "the tenant or queue is not in the tenancy configuration",
    PendingReason.NO_QUOTA_FOR_TYPE: "the queue has no quota for this GPU type and cannot borrow any",
    PendingReason.PREEMPTING: "running jobs have been told to stop to make room; starts when they exit",
}


class PreemptionReason(str, enum.Enum):
    """Why a running job is told to stop."""

    PRIORITY = "priority"  # a higher-priority job in the same queue needs the room
    RECLAIM = "reclaim"  # the owner of borrowed quota needs it back
    FAIR_SHARE = "fair_share"  # the victim's tenant is above its fair share, the preemptor's below
    SERVICE = "service"  # the victim has received more GPU time than the waiting job (least attained service)


PREEMPTION_TEXT: dict[PreemptionReason, str] = {
    PreemptionReason.PRIORITY: "preempted for a higher-priority job in the same queue",
    PreemptionReason.RECLAIM: "preempted because the queue that lent the quota needs it back",
    PreemptionReason.FAIR_SHARE: "preempted because the tenant is above its fair share and another is below",
    PreemptionReason.SERVICE: "preempted for a job that has received less GPU time so far (least attained service)",
}
