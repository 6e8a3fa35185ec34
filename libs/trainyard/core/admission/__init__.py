"""Which jobs run: ``admit(snapshot, policy, now) -> AdmissionResult``."""

from trainyard.core.admission.candidates import HolderTable
from trainyard.core.admission.cycle import admit
from trainyard.core.admission.fairshare import decay_usage, decay_usage_table
from trainyard.core.admission.fit import FleetSummary, never_fits
from trainyard.core.admission.intake import check_quota, validate_against_tenancy
from trainyard.core.admission.snapshot import (
    AdmissionPolicy,
    AdmissionResult,
    AdmissionSnapshot,
    Admit,
    PendingJob,
    Preemption,
    RunningJob,
    Waiting,
    queue_key,
)
from trainyard.core.admission.tree import Cohort, FlavorQuota, PreemptionSettings, PriorityClass, QueueQuota, Tenancy

__all__ = [
    "AdmissionPolicy",
    "AdmissionResult",
    "AdmissionSnapshot",
    "Admit",
    "Cohort",
    "FleetSummary",
    "FlavorQuota",
    "HolderTable",
    "PendingJob",
    "Preemption",
    "PreemptionSettings",
    "PriorityClass",
    "QueueQuota",
    "RunningJob",
    "Tenancy",
    "Waiting",
    "admit",
    "check_quota",
    "decay_usage",
    "decay_usage_table",
    "never_fits",
    "queue_key",
    "validate_against_tenancy",
]
