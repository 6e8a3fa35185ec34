"""``trainyard sim ...``: the discrete-event simulator."""

import typer

sim_app = typer.Typer(help="Replay cluster traces through the scheduling core.", no_args_is_help=True)
