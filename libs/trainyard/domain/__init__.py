"""Value types shared by every service: jobs, gangs, nodes, topology."""

from trainyard.domain.job import (
    JobSpec,
    Role,
    TopologyConstraint,
    TopologyLevel,
    ValidationError,
    validate_job_id,
    validate_job_spec,
    validate_submission,
)
from trainyard.domain.node import NodeInfo, NodeState

__all__ = [
    "JobSpec",
    "NodeInfo",
    "NodeState",
    "Role",
    "TopologyConstraint",
    "TopologyLevel",
    "ValidationError",
    "validate_job_id",
    "validate_job_spec",
    "validate_submission",
]
