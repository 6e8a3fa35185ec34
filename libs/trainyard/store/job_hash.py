"""The job hash: how the projection stores a :class:`JobRecord`, and the one
decoder that reads it back.

``lua/apply_job_event.lua`` keeps each job as the hash ``job:<id>``, one field
per field of :class:`~trainyard.core.lifecycle.JobRecord` but the job id
(which is in the key): numbers as text, the GPUs by type, the errors and the
placement as JSON (``""`` for no placement), the spec as the JSON the
``JobAccepted`` event carried.  Every reader of a job hash decodes it with
:func:`decode_job`, whether it read all of it (``HGETALL``) or only the
fields it needs (``HMGET`` of :data:`HEAD` plus its own).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from trainyard.core.lifecycle import JobRecord

#: The fields every record needs (every partial read includes them).
HEAD = ("status", "tenant", "order", "last_seq")


def _reader(tp: Any) -> Callable[[str], Any] | None:
    """How a field of type ``tp`` is read back from the text Redis holds; None: it is text."""
    (base,) = set(typing.get_args(tp)) - {type(None)} if isinstance(tp, types.UnionType) else {tp}
    if base is str:
        return None
    if base in (int, float, msgspec.Raw):
        return base  # type: ignore[no-any-return]
    return msgspec.json.Decoder(base).decode  # the fields written as JSON


#: Field name -> how to read it, for every field of a job hash.
_READERS = {f.name: _reader(f.type) for f in msgspec.structs.fields(JobRecord) if f.name != "job_id"}

#: Every field of a job hash.
FIELDS = tuple(_READERS)


def decode_job(job_id: str, h: Mapping[str, str | None]) -> JobRecord | None:
    """The record of a job hash, from all its fields or some (a field not read,
    or absent, takes its default); None when the hash has no status, which is
    no job: the projection has not folded one under this id."""
    if not h.get("status"):
        return None
    values: dict[str, Any] = {}
    for name, raw in h.items():
        if name not in _READERS or raw is None:
            continue  # a field of another version, or not in the hash
        read = _READERS[name]
        if read is None:
            values[name] = raw
        elif raw != "":  # "" (a placement given back) is no value
            values[name] = read(raw)
    return JobRecord(job_id=job_id, **values)


def read_fields(fields: Iterable[str] | None) -> tuple[str, ...] | None:
    """The fields to ``HMGET`` for a reader that needs ``fields`` (with :data:`HEAD`);
    None: all of them (``HGETALL``)."""
    if fields is None:
        return None
    wanted = set(fields)
    unknown = wanted - set(FIELDS)
    if unknown:
        raise ValueError(f"not fields of a job hash: {sorted(unknown)}")
    return HEAD + tuple(f for f in FIELDS if f in wanted and f not in HEAD)


def decode_rows(job_ids: Sequence[str], fields: tuple[str, ...] | None, rows: Sequence[Any]) -> list[JobRecord]:
    """The records of ``job_ids`` from their ``HGETALL`` replies (``fields`` None)
    or ``HMGET`` replies of ``fields``; hashes that are no job are left out.
    ``HMGET`` rows are read by :func:`_row_reader`, which gives what
    :func:`decode_job` gives for the same fields (a property test checks)."""
    if fields is not None:
        return _row_reader(fields)(job_ids, rows)
    out = []
    for job_id, row in zip(job_ids, rows, strict=True):
        record = decode_job(job_id, row)
        if record is not None:
            out.append(record)
    return out


@functools.lru_cache(maxsize=64)
def _row_reader(fields: tuple[str, ...]) -> Callable[[Sequence[str], Sequence[Any]], list[JobRecord]]:
    """:func:`decode_job` for ``HMGET`` rows of ``fields``, with the reader of
    each column looked up once (a cold admission cycle reads 100,000 rows)."""
    last = {name: column for column, name in enumerate(fields)}  # a repeated field: its last value, as dict() keeps
    plan = [(name, _READERS[name], column) for name, column in last.items() if name in _READERS]
    status = fields.index("status") if "status" in fields else None

    def read_rows(job_ids: Sequence[str], rows: Sequence[Any]) -> list[JobRecord]:
        out = []
        for job_id, row in zip(job_ids, rows, strict=True):
            if len(row) != len(fields):
                raise ValueError(f"a reply of {len(row)} values for {len(fields)} fields")
            if status is None or not row[status]:
                continue  # no status: no job under this id
            values: dict[str, Any] = {}
            for name, read, column in plan:
                raw = row[column]
                if raw is None:
                    continue
                if read is None:
                    values[name] = raw
                elif raw != "":
                    values[name] = read(raw)
            out.append(JobRecord(job_id=job_id, **values))
        return out

    return read_rows
