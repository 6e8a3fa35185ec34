"""Which jobs run: ``admit(snapshot, policy, now) -> AdmissionResult``."""

from trainyard.core.admission.cycle import (
    AdmissionPolicy,
    AdmissionResult,
    AdmissionSnapshot,
    Admit,
    PendingJob,
    Waiting,
    admit,
)

__all__ = ["AdmissionPolicy", "AdmissionResult", "AdmissionSnapshot", "Admit", "PendingJob", "Waiting", "admit"]
