"""Decoding request bodies with msgspec, every bad field named the way
``validate_job_spec`` names fields (``roles[0].replicas``), for REST, gRPC
and the console's job form alike.

msgspec stops at the first value that does not fit, and ignores a key the
job spec does not declare, so a misspelt ``gpus_per_replcia`` would submit a
1-GPU job.  So every body is also read as plain JSON and walked along the
declared fields of its type (:func:`trainyard.shapes.shape_problems`): each
unknown key (with the nearest declared name), missing field and value that
does not fit is listed with its path, all in one answer.  A valid body is
decoded once and walked once.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from trainyard.domain.job import ValidationError, capped, error_location
from trainyard.shapes import shape_problems
from trainyard_gateway.jobs import InvalidRequest
from trainyard_gateway.schema import SubmitJobBody

T = TypeVar("T")

_submission = msgspec.json.Decoder(SubmitJobBody)
_untyped = msgspec.json.Decoder()


def decode_submission(raw: bytes) -> SubmitJobBody:
    """A job submission from a JSON body; :class:`InvalidRequest` naming every
    bad field (``body`` when it is not JSON)."""
    try:
        body: SubmitJobBody | None = _json(_submission, raw)
        typed: msgspec.ValidationError | None = None
    except msgspec.ValidationError as err:  # JSON that does not fit: find where
        body, typed = None, err
    try:
        value = _json(_untyped, raw)
    except msgspec.ValidationError as plain:  # not even plain JSON values (a number out of range): msgspec's place
        message, field = error_location(typed or plain)
        raise InvalidRequest([ValidationError(field or "body", message)]) from None
    problems = shape_problems(value, SubmitJobBody)
    if problems or body is None:
        _refuse(problems, typed, "body")
    assert body is not None
    return body


def convert(value: Any, shape: type[T], root: str) -> T:
    """``value`` (JSON-like builtins) as ``shape``; :class:`InvalidRequest`
    naming every value that does not fit (``root`` for the whole)."""
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as err:
        _refuse(shape_problems(value, shape), err, root)
        raise  # not reached: _refuse raises


def _refuse(problems: list[tuple[str, str]], typed: Exception | None, root: str) -> None:
    if not problems:  # msgspec refused what the walk let pass: its own words
        problems = [("", str(typed).replace("`", ""))]
    raise InvalidRequest(capped([ValidationError(field or root, message) for field, message in problems]))


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
