"""The ``trainyard`` command."""
