"""Declarative configuration read at start-up (tenancy: organisations, teams, queues, quotas)."""

from trainyard.config.diff import diff_tenancy
from trainyard.config.tenancy import (
    ConfigError,
    FairShareConfig,
    FlavorConfig,
    OrganisationConfig,
    PreemptionConfig,
    PriorityClassConfig,
    QueueConfig,
    QuotaLimits,
    TeamConfig,
    TenancyConfig,
    TenancyConfigError,
    compile_tenancy,
    load_tenancy,
    priority_class_of,
    validate_against_tenancy,
)
from trainyard.config.validation import validate_tenancy

__all__ = [
    "ConfigError",
    "FairShareConfig",
    "FlavorConfig",
    "OrganisationConfig",
    "PreemptionConfig",
    "PriorityClassConfig",
    "QueueConfig",
    "QuotaLimits",
    "TeamConfig",
    "TenancyConfig",
    "TenancyConfigError",
    "compile_tenancy",
    "diff_tenancy",
    "load_tenancy",
    "priority_class_of",
    "validate_against_tenancy",
    "validate_tenancy",
]
