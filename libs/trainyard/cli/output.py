"""How list and show commands print, in kubectl's manner: ``-o table`` (the
default), ``-o wide`` (more columns), ``-o json``, ``-o yaml`` and ``-o name``
(ids only, one a line), ``--json`` as ``-o json``, and ``--no-headers``.

On a terminal a table is drawn with rich; piped or redirected it is plain
text in aligned columns, never cut and never wrapped, so ``trainyard jobs |
grep running`` and ``awk '{print $1}'`` see whole cells."""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import typer

Item = dict[str, Any]


class Output(str, enum.Enum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


OutputOpt = typer.Option(
    Output.table,
    "--output",
    "-o",
    case_sensitive=False,
    help="table; wide (more columns); json; yaml; name (ids only, one a line). "
    "Piped or redirected, tables are printed whole (never cut) for grep and awk.",
)
AsJson = typer.Option(False, "--json", help="The same as -o json.")
NoHeaders = typer.Option(False, "--no-headers", help="Print tables without their header line.")


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Item], str]
    wide: bool = False  # shown only with -o wide


def chosen(output: Output, as_json: bool) -> Output:
    """The format asked for: ``--json`` is ``-o json``."""
    return Output.json if as_json else output


def print_data(data: Any, output: Output) -> bool:
    """Print ``data`` as JSON or YAML when asked; whether it did."""
    if output is Output.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return True
    if output is Output.yaml:
        import msgspec.yaml  # only here: it loads PyYAML

        sys.stdout.write(msgspec.yaml.encode(data).decode())
        return True
    return False


def print_shown(item: Any, output: Output, name: str) -> bool:
    """For a show command: print ``item`` as JSON or YAML, or only its ``name``, when
    asked; whether it did (else the command prints it for people)."""
    if print_data(item, output):
        return True
    if output is Output.name:
        sys.stdout.write(f"{name}\n")
        return True
    return False


def print_items(
    items: Sequence[Item],
    columns: Sequence[Column],
    output: Output,
    no_headers: bool = False,
    name: Callable[[Item], str] | None = None,
) -> None:
    """``items`` in the format asked for; ``name`` gives an item's id for ``-o name``."""
    if print_data(list(items), output):
        return
    if output is Output.name:
        key = name or columns[0].cell
        sys.stdout.write("".join(f"{key(item)}\n" for item in items))
        return
    shown = [c for c in columns if output is Output.wide or not c.wide]
    rows = [[c.cell(item) for c in shown] for item in items]
    print_table([c.header for c in shown], rows, no_headers)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], no_headers: bool = False) -> None:
    """A table: drawn by rich on a terminal; plain aligned columns otherwise."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(*(h.upper() for h in headers), show_header=not no_headers, box=None, header_style="bold")
        for column in table.columns:
            column.overflow = "fold"  # a cell too wide for the terminal wraps, it is never cut short
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))  # a job's name is text, not markup
        Console().print(table)
        return
    sys.stdout.write(plain_table(headers, rows, no_headers))


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]], no_headers: bool = False) -> str:
    """Columns aligned with spaces, as kubectl and squeue print them; the last one unpadded.
    An empty cell reads ``-``, so awk counts the same fields on every line (up to a cell with a space)."""
    lines = [list(row) for row in rows] if no_headers else [[h.upper() for h in headers], *map(list, rows)]
    lines = [[cell.replace("\n", " ") or "-" for cell in line] for line in lines]
    if not lines:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=False)] + [line[-1]]
        out.append("   ".join(cells).rstrip() + "\n")
    return "".join(out)
