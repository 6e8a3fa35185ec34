"""``trainyard node ...`` and ``trainyard agent``: operator commands for GPU nodes."""

import typer

node_app = typer.Typer(help="Cordon, drain, uncordon and inspect GPU nodes.", no_args_is_help=True)
