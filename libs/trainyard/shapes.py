"""Every way a document people write (a job spec, a tenancy file) fails to fit
its declared type, each with the path to fix, in one pass.

msgspec stops at the first value that does not fit and says where only inside
its message.  :func:`shape_problems` walks the document along the declared
fields of the type (:func:`msgspec.structs.fields`) instead: a key the type
does not declare is reported with the nearest declared name ("did you mean
'gpus_per_replica'?"), a missing required field as "is required", and a value
that does not fit on its own with msgspec's message for that value alone.
Paths are written as ``roles[0].gpus_per_replica`` and ``quota.H100.nominal``.
"""

from __future__ import annotations

import difflib
import enum
import types
from collections.abc import Iterable
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec

_ARRAYS = (list, set, frozenset, tuple)


def did_you_mean(given: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name nearest ``given`` (a change of case first, then a name it
    begins, then the closest spelling), else ``""``."""
    names = sorted(k for k in known if isinstance(k, str))
    typed = str(given).lower()
    same_case = [k for k in names if k.lower() == typed]
    begun = [k for k in names if len(typed) >= 3 and k.lower().startswith(typed)]
    close = same_case or begun[:1] or difflib.get_close_matches(str(given), names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_key(kind: str, given: str, known: Iterable[str]) -> str:
    """The message for a name that is not one of ``known``: the nearest one, else the whole list."""
    names = sorted(k for k in known if isinstance(k, str))
    hint = did_you_mean(given, names)
    return f"unknown {kind} {given!r}{hint}" if hint else f"unknown {kind} {given!r}; known: {', '.join(names)}"


def shape_problems(value: Any, shape: Any, path: str = "", strict: bool = True) -> list[tuple[str, str]]:
    """Every (path, message) where ``value`` (JSON-like builtins) does not fit ``shape``: unknown keys,
    missing fields and values of the wrong kind, in the order the document gives them.  Empty when it fits
    (unknown keys included: a key no field declares is a problem even where msgspec would ignore it)."""
    read_as = _read_as(shape, value)
    if isinstance(read_as, type) and issubclass(read_as, msgspec.Struct):
        return _struct_problems(value, read_as, path, strict)
    if get_origin(read_as) in _ARRAYS:
        args = get_args(read_as)
        problems: list[tuple[str, str]] = []
        for i, item in enumerate(value):
            item_shape = args[0] if args and (get_origin(read_as) is not tuple or args[-1] is Ellipsis) else Any
            problems += shape_problems(item, item_shape, f"{path}[{i}]", strict)
        return problems
    if get_origin(read_as) is dict:
        key_shape, item_shape = get_args(read_as)
        problems = []
        for key, item in value.items():
            where = _join(path, str(key))
            problems += [(where, m) for _, m in _leaf(key, key_shape, where, strict)]
            problems += shape_problems(item, item_shape, where, strict)
        return problems
    return _leaf(value, shape, path, strict)


def known_only(value: Any, shape: Any) -> Any:
    """``value`` without the keys ``shape`` does not declare, at every level: what the rest of a document
    says can then be checked too, while its unknown keys are reported."""
    read_as = _read_as(shape, value)
    if isinstance(read_as, type) and issubclass(read_as, msgspec.Struct):
        fields = {f.encode_name: f for f in msgspec.structs.fields(read_as)}
        return {k: known_only(v, fields[k].type) for k, v in value.items() if k in fields}
    if get_origin(read_as) in _ARRAYS:
        args = get_args(read_as)
        item_shape = args[0] if args and (get_origin(read_as) is not tuple or args[-1] is Ellipsis) else Any
        return [known_only(item, item_shape) for item in value]
    if get_origin(read_as) is dict:
        return {k: known_only(v, get_args(read_as)[1]) for k, v in value.items()}
    return value


def _struct_problems(
    value: dict[str, Any], struct: type[msgspec.Struct], path: str, strict: bool
) -> list[tuple[str, str]]:
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    problems: list[tuple[str, str]] = []
    for key, item in value.items():
        if key in fields:
            problems += shape_problems(item, fields[key].type, _join(path, key), strict)
        else:
            problems.append((_join(path, str(key)), unknown_key("field", str(key), fields)))
    for key, field in fields.items():
        if field.required and key not in value:
            problems.append((_join(path, key), "is required"))
    return problems


def _leaf(value: Any, shape: Any, path: str, strict: bool) -> list[tuple[str, str]]:
    if shape is Any:
        return []
    try:
        msgspec.convert(value, shape, strict=strict)
        return []
    except msgspec.ValidationError as err:
        message = str(err).rpartition(" - at `$")[0] or str(err)
        return [(path, message.replace("`", "") + _choices(shape))]


def _read_as(shape: Any, value: Any) -> Any:
    """The type (``shape`` or one member of its union) an object or array
    ``value`` is read as; None for a scalar, or for a value no member reads."""
    for option in _members(shape):
        origin = get_origin(option)
        if isinstance(value, dict) and (
            origin is dict or isinstance(option, type) and issubclass(option, msgspec.Struct)
        ):
            return option
        if isinstance(value, list) and origin in _ARRAYS:
            return option
    return None


def _members(shape: Any) -> list[Any]:
    """``shape``'s alternatives (one, unless it is a union), constraints stripped."""
    if get_origin(shape) is Annotated:
        return _members(get_args(shape)[0])
    if get_origin(shape) in (Union, types.UnionType):
        return [m for arg in get_args(shape) for m in _members(arg)]
    return [shape]


def _choices(shape: Any) -> str:
    """The values an enum field takes, to say along with its error."""
    kinds = [m for m in _members(shape) if isinstance(m, type) and issubclass(m, enum.Enum)]
    return "; use one of " + ", ".join(str(v.value) for kind in kinds for v in kind) if kinds else ""


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
