"""``trainyard export ...`` and ``trainyard report ...``: chargeback and capacity planning."""

import typer

export_app = typer.Typer(help="Chargeback exports for finance.", no_args_is_help=True)
report_app = typer.Typer(help="Capacity-planning reports.", no_args_is_help=True)
