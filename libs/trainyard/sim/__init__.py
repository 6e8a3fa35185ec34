"""Discrete-event simulator: real traces and synthetic mixes through the real scheduling core."""

from trainyard.sim.cluster import SimCluster, build_nodes
from trainyard.sim.engine import Scenario, Simulator, simulate
from trainyard.sim.failures import NO_FAILURES, FailureModel
from trainyard.sim.policies import POLICIES, Policy, policy_named
from trainyard.sim.tenancy import tenancy_for
from trainyard.sim.workloads import SimJob, Workload, load_philly, synthetic

__all__ = [
    "NO_FAILURES",
    "POLICIES",
    "FailureModel",
    "Policy",
    "Scenario",
    "SimCluster",
    "SimJob",
    "Simulator",
    "Workload",
    "build_nodes",
    "load_philly",
    "policy_named",
    "simulate",
    "synthetic",
    "tenancy_for",
]
