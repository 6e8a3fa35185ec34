"""Tenancy files for tests: one organisation, one team, one queue."""

from __future__ import annotations


def one_team(team: str = "acme", gpus: int = 128, queue: str = "default") -> str:
    """A tenancy YAML in which ``team`` alone has ``gpus`` H100s (emulated
    8-GPU nodes) in ``queue``, with one priority class, ``standard``."""
    return f"""
flavors: [{{name: H100, node_pool: emulated, gpus_per_node: 8}}]
priority_classes: [{{name: standard, priority: 500}}]
default_priority_class: standard
organisations:
  - name: lab
    quota: {{H100: {{nominal: {gpus}}}}}
    teams:
      - name: {team}
        quota: {{H100: {{nominal: {gpus}}}}}
        queues:
          - name: {queue}
            quota: {{H100: {{nominal: {gpus}}}}}
"""
