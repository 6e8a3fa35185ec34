"""Decoding request bodies with msgspec, a bad field named the way
``validate_job_spec`` names fields (``roles[0].replicas``), for REST, gRPC
and the console's job form alike.

msgspec stops at the first value that does not fit and says where only
inside its message; it has no structured location to read.  So a body that
fails is converted again along the declared fields of its type
(:func:`msgspec.structs.fields`), descending into the objects, arrays and maps
that fail, until the value that fails on its own is found.  The path is built
from the fields and indices walked; the message is msgspec's for that value
alone, which carries no location.  A valid body is decoded once.
"""

from __future__ import annotations

import enum
import types
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec

from trainyard.domain.job import ValidationError, error_location
from trainyard_gateway.jobs import InvalidRequest
from trainyard_gateway.schema import SubmitJobBody

T = TypeVar("T")

_submission = msgspec.json.Decoder(SubmitJobBody)
_untyped = msgspec.json.Decoder()
_ARRAYS = (list, set, frozenset)


def decode_submission(raw: bytes) -> SubmitJobBody:
    """A job submission from a JSON body; :class:`InvalidRequest` naming the
    bad field (``body`` when it is not JSON)."""
    try:
        return _json(_submission, raw)
    except msgspec.ValidationError as typed:  # JSON that does not fit: find where
        try:
            value = _json(_untyped, raw)
        except msgspec.ValidationError:  # not even plain JSON values (a number out of range): msgspec's place
            message, field = error_location(typed)
            raise InvalidRequest([ValidationError(field or "body", message)]) from None
        return convert(value, SubmitJobBody, root="body")


def convert(value: Any, shape: type[T], root: str) -> T:
    """``value`` (JSON-like builtins) as ``shape``; :class:`InvalidRequest`
    naming the first value that does not fit (``root`` for the whole)."""
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as err:
        problem = first_problem(value, shape) or ValidationError("", str(err).replace("`", ""))
        raise InvalidRequest([ValidationError(problem.field or root, problem.message)]) from None


def _json(decoder: msgspec.json.Decoder[Any], raw: bytes) -> Any:
    """``raw`` through ``decoder``; :class:`InvalidRequest` when it is not
    JSON or nests too deeply, ``msgspec.ValidationError`` when it does not fit."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as err:
        raise InvalidRequest([ValidationError("body", f"the body is not valid JSON: {err}")]) from None
    except RecursionError:  # msgspec's depth limit, reached by nesting in an unknown field
        raise InvalidRequest([ValidationError("body", "nested too deeply; a job spec is a few levels deep")]) from None


def first_problem(value: Any, shape: Any, path: str = "") -> ValidationError | None:
    """Where ``value`` first fails to convert to ``shape``, as msgspec would
    report it (fields in the order given, then missing ones); None when it fits."""
    try:
        msgspec.convert(value, shape)
        return None
    except msgspec.ValidationError as err:
        failure = str(err)
    read_as = _read_as(shape, value)
    if isinstance(read_as, type) and issubclass(read_as, msgspec.Struct):
        fields = {f.encode_name: f for f in msgspec.structs.fields(read_as)}
        for key, item in value.items():
            found = first_problem(item, fields[key].type, _join(path, key)) if key in fields else None
            if found is not None:
                return found
        for key, field in fields.items():
            if field.required and key not in value:
                return ValidationError(_join(path, key), "is required")
    elif get_origin(read_as) in _ARRAYS:
        (item_shape,) = get_args(read_as)
        for i, item in enumerate(value):
            if (found := first_problem(item, item_shape, f"{path}[{i}]")) is not None:
                return found
    elif get_origin(read_as) is dict:
        _, item_shape = get_args(read_as)
        for item in value.values():
            if (found := first_problem(item, item_shape, f"{path}[...]")) is not None:
                return found
    # Nothing inside fails on its own: the value itself does not fit.
    return ValidationError(path, failure.replace("`", "") + _choices(shape))


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
