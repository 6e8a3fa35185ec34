"""Kubernetes: bind placements to suspended Jobs and JobSets, read GPU nodes.

``translate`` is pure (dicts in, dicts out) and tested; ``binder`` is the thin
layer that calls the Kubernetes API with it.
"""
