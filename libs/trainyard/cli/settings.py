"""The shared settings (:mod:`trainyard.settings`) as the command line reads
them: a bad ``TRAINYARD_*`` variable ends the command saying what to fix."""

from __future__ import annotations

import typer
from rich.console import Console

from trainyard.settings import ConfigurationError, Settings, load_settings


def cli_settings() -> Settings:
    """This command's settings, read from its environment."""
    try:
        return load_settings()
    except ConfigurationError as err:
        Console(stderr=True).print(f"[red]error:[/red] {err}", highlight=False)
        raise typer.Exit(2) from err
