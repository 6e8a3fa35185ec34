"""Option values converted without pydantic, so ``trainyard jobs`` answers sooner.

Typer 0.29 converts every option's text through a pydantic ``TypeAdapter``,
and importing pydantic takes about a quarter of ``trainyard jobs`` (bench/cli.py).
The options of the list and show commands are of plain kinds (text, flags,
whole numbers without bounds, a choice from an Enum); those are converted here as
typer's adapters would.  Every other kind (paths, bounded numbers, lists,
dates, a custom parser) goes to typer's own conversion, pydantic and all.

:func:`install` replaces typer's ``build_runtime_param`` (a private function);
where a later typer has none, it changes nothing and typer converts as before.
tests/services/test_cli_output.py checks that ``trainyard jobs`` loads no
pydantic, so an upgrade that drops this path is noticed."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import typer
from typer import core as typer_core

try:  # typer's private conversion API (0.29)
    from typer._coercion import RuntimeParam, TypeDescriptor
    from typer._param_types import coerce_cli_choice
except ImportError:  # another typer: install() changes nothing
    RuntimeParam = None  # type: ignore[assignment,misc]


_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})  # as pydantic reads a boolean
_FALSE = frozenset({"", "0", "false", "f", "no", "n", "off"})


def _plain(descriptor: Any) -> bool:
    """Whether the option is of a kind converted here."""
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if descriptor.file_annotation is not None or getattr(info, "parser", None) is not None:
        return False
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return True
    if annotation in (str, bool):  # typer's adapters for these check nothing else (paths are typed Path)
        return True
    if annotation is int:
        return info.min is None and info.max is None and not info.clamp
    return False


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """Text, a flag, an unbounded whole number or an Enum choice, converted as typer's adapters do."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            annotation = self.annotation
            if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
                try:
                    return coerce_cli_choice(
                        value, choices=list(annotation), case_sensitive=self.parameter_info.case_sensitive, ctx=ctx
                    )
                except ValueError as err:
                    raise typer.BadParameter(str(err), ctx=ctx, param=param) from None
            if annotation is bool:
                if isinstance(value, bool):
                    return value
                word = str(value).strip().lower()
                if word in _TRUE or word in _FALSE:
                    return word in _TRUE
                raise typer.BadParameter(f"{value!r} is not true or false.", ctx=ctx, param=param)
            if annotation is int:
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
                try:
                    return int(str(value).strip())
                except ValueError:
                    raise typer.BadParameter(f"{value!r} is not a whole number.", ctx=ctx, param=param) from None
            return value.decode() if isinstance(value, bytes) else str(value)


def install() -> bool:
    """Convert plain options here from now on; whether it could."""
    typer_build = getattr(typer_core, "build_runtime_param", None)
    if RuntimeParam is None or typer_build is None or getattr(typer_build, "trainyard_plain", False):
        return RuntimeParam is not None and typer_build is not None

    def build_runtime_param(descriptor: TypeDescriptor) -> Any:
        if _plain(descriptor):
            return PlainParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
        return typer_build(descriptor)

    build_runtime_param.trainyard_plain = True  # type: ignore[attr-defined]
    typer_core.build_runtime_param = build_runtime_param
    return True
