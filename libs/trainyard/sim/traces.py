"""Bring your own trace: jobs and node lists as CSV or Parquet files.

A trace has one row per job (docs/traces.md):

===================  ========  ==============================================================
column               required  meaning
===================  ========  ==============================================================
``submit_time``      yes       seconds, any origin (the loader moves the first job to 0)
``duration``         yes       seconds of work on a healthy gang (> 0)
``gpus``             yes       GPUs the job asks for (> 0; fractions are rounded up, below)
``tenant``           yes       who submits it (lowercase name)
``gpu_type``         no        a GPU type the job must run on; empty: the cluster's type
``queue``            no        the tenant's queue; empty: ``default``
``priority_class``   no        ``production``, ``standard`` (empty) or ``best-effort``
``runtime_estimate`` no        the user's run-time limit (s); empty: twice the duration,
                               rounded up to the hour (:func:`estimate_limit`)
``job_id``           no        the job's id in the source trace (kept, must be unique)
===================  ========  ==============================================================

The scheduler gives out whole GPUs, so a request of 0.5 GPU is rounded up to
1 GPU and 2.5 GPUs to 3; :attr:`Workload.rounded` counts those jobs.  Jobs
larger than 8 GPUs become gangs of 8-GPU replicas (:func:`gang_of`).

A node list has one row per node: ``node_id``, ``gpus``, ``gpu_model``,
``rack``, ``block`` and optionally ``zone`` and ``nvlink_domain``.

Rows are numbered from 1 (the first row after the header).  Every bad cell is
reported with its file, row and column; up to :data:`MAX_ERRORS` are collected
before the load fails.  Parquet needs ``pyarrow`` (the ``parquet`` extra).
Writing either format, and the Philly converter: :mod:`trainyard.sim.trace_writers`.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
from collections.abc import Iterator
from pathlib import Path

from trainyard.domain.job import GPU_TYPE_RE, MAX_RUNTIME_S
from trainyard.domain.limits import NAME_RE
from trainyard.domain.node import NodeInfo
from trainyard.sim.tenancy import PRIORITY_CLASSES
from trainyard.sim.workloads import GPU_TYPE, QUEUE, SimJob, Workload, gang_of

TRACE_REQUIRED = ("submit_time", "duration", "gpus", "tenant")
TRACE_OPTIONAL = ("gpu_type", "queue", "priority_class", "runtime_estimate", "job_id")
TRACE_COLUMNS = (
    "submit_time",
    "duration",
    "gpus",
    "gpu_type",
    "tenant",
    "queue",
    "priority_class",
    "runtime_estimate",
    "job_id",
)
NODE_REQUIRED = ("node_id", "gpus", "gpu_model", "rack", "block")
NODE_OPTIONAL = ("zone", "nvlink_domain")
MAX_ERRORS = 20  # bad cells collected before a load gives up
MAX_JOB_GPUS = 16_384 * 8  # the most replicas a role may have, of whole 8-GPU nodes
CLASSES = tuple(c.name for c in PRIORITY_CLASSES)
Path_ = str | os.PathLike[str]


class TraceError(ValueError):
    """A trace or node list that cannot be used; the message lists what to fix."""


class _Problems:
    """Bad cells of one file, as ``file row N, column C: what is wrong``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.count = 0

    def add(self, row: int, column: str, text: str) -> None:
        self.count += 1
        if len(self.lines) < MAX_ERRORS:
            self.lines.append(f"{self.name} row {row}, column {column}: {text}")

    @property
    def full(self) -> bool:
        return self.count >= MAX_ERRORS

    def raise_if_any(self) -> None:
        if not self.count:
            return
        count = f"{self.count} error{'s' if self.count != 1 else ''}"
        if self.full:
            count = f"{MAX_ERRORS} errors (stopped reading there)"
        raise TraceError(f"{self.name}: {count}; fix and load again:\n" + "\n".join(self.lines))


def parquet_modules():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError(
            "reading or writing Parquet needs pyarrow: pip install 'trainyard[parquet]' (or use a .csv file)"
        ) from None
    return pa, pq


def file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise TraceError(f"{path.name}: unknown file type {suffix or '(none)'!r}; use .csv or .parquet")


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value).strip()


def _rows(path: Path, required: tuple[str, ...], optional: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """The file's rows as strings (empty: missing); fails at once if a required column is missing."""
    kind = file_kind(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with contextlib.ExitStack() as closing:
        if kind == "parquet":
            pa, pq = parquet_modules()
            try:
                table = pq.read_table(path)
            except (pa.ArrowException, OSError) as e:
                raise TraceError(
                    f"{path.name}: not a readable Parquet file ({e}); write it again or use a .csv"
                ) from None
            header = list(table.column_names)
            records: Iterator[dict] = iter(table.to_pylist())
        else:
            reader = csv.DictReader(closing.enter_context(open(path, newline="", encoding="utf-8-sig")))
            try:
                header = [h.strip() for h in reader.fieldnames or []]
            except (UnicodeDecodeError, csv.Error) as e:
                raise _unreadable(path, 0, e) from None
            reader.fieldnames = header
            records = reader
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{path.name}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                f"needs {', '.join(required)} (optional: {', '.join(optional)}); has "
                f"{', '.join(header) or 'no header'}"
            )
        row = 0
        try:
            for rec in records:
                row += 1
                yield {k: _cell(rec.get(k)) for k in (*required, *optional)}
        except (UnicodeDecodeError, csv.Error) as e:
            raise _unreadable(path, row + 1, e) from None


def _not_utf8(path: Path) -> str:
    """Where the first byte that is not UTF-8 sits (text is decoded in blocks, so the reader cannot say)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return f"{path.name} line {line}: byte 0x{data[e.start]:02x} is not UTF-8 text; save the file as UTF-8 CSV"
    return f"{path.name}: not UTF-8 text; save the file as UTF-8 CSV"


def _unreadable(path: Path, row: int, err: UnicodeDecodeError | csv.Error) -> TraceError:
    """A CSV file that cannot be read as text: its name and row (0: the header) and what to do."""
    if isinstance(err, UnicodeDecodeError):
        return TraceError(_not_utf8(path))
    where = f"{path.name} row {row}" if row else f"{path.name} header"
    return TraceError(f"{where}: not readable as CSV ({err}); is this a comma-separated trace?")


def _number(p: _Problems, row: int, col: str, raw: str, positive: bool = True) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (positive and value <= 0):
        p.add(
            row,
            col,
            f"{raw!r} is not a {'positive ' if positive else ''}number"
            + (" (leave it empty or give seconds)" if col == "runtime_estimate" else ""),
        )
        return None
    return value


def _name(p: _Problems, row: int, col: str, raw: str) -> str | None:
    if not NAME_RE.match(raw):
        p.add(
            row,
            col,
            f"{raw!r} is not a valid name: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit",
        )
        return None
    return raw


def load_trace(path: Path_, gpus: int | None = None) -> Workload:
    """The jobs of a trace file, sorted by submission, the first submitted at 0.

    Tenants' quotas split ``gpus`` in proportion to the GPU-seconds each
    submitted; without ``gpus``, the GPUs of a cluster the trace would keep
    exactly busy (offered load 1, in whole 8-GPU nodes, at least the largest job).
    """
    path = Path(path)
    p = _Problems(path.name)
    parsed: list[tuple[float, int, SimJob]] = []
    ids: dict[str, int] = {}
    rounded = 0
    typed: dict[str, int] = {}
    for row, cells in enumerate(_rows(path, TRACE_REQUIRED, TRACE_OPTIONAL), start=1):
        if p.full:
            break
        before = p.count
        submit = _number(p, row, "submit_time", cells["submit_time"], positive=False)
        duration = _number(p, row, "duration", cells["duration"])
        want = _number(p, row, "gpus", cells["gpus"])
        if want is not None and want > MAX_JOB_GPUS:
            p.add(row, "gpus", f"{cells['gpus']!r} is more GPUs than one job can ask for (at most {MAX_JOB_GPUS:,})")
        tenant = _name(p, row, "tenant", cells["tenant"])
        queue = _name(p, row, "queue", cells["queue"]) if cells["queue"] else QUEUE
        klass = cells["priority_class"] or "standard"
        if klass not in CLASSES:
            p.add(row, "priority_class", f"{klass!r} is not a priority class; use one of {', '.join(CLASSES)}")
        gpu_type = cells["gpu_type"] or GPU_TYPE
        if cells["gpu_type"] and not GPU_TYPE_RE.match(cells["gpu_type"]):
            p.add(
                row,
                "gpu_type",
                f"{cells['gpu_type']!r} is not a GPU type name: letters, digits, '_' or '-', "
                "at most 32; leave it empty for any type",
            )
        limit = None
        if cells["runtime_estimate"]:
            estimate = _number(p, row, "runtime_estimate", cells["runtime_estimate"])
            if estimate is not None and estimate > MAX_RUNTIME_S:
                p.add(
                    row,
                    "runtime_estimate",
                    f"{cells['runtime_estimate']!r} is longer than the longest run-time "
                    f"limit a job may ask for ({MAX_RUNTIME_S:,} s)",
                )
            elif estimate is not None:
                limit = max(int(math.ceil(estimate)), 1)
        trace_id = cells["job_id"] or None
        if trace_id is not None and trace_id in ids:
            p.add(row, "job_id", f"{trace_id!r} is used twice (first on row {ids[trace_id]}); job ids must be unique")
        elif trace_id is not None:
            ids[trace_id] = row
        if p.count > before or submit is None or duration is None or want is None or tenant is None:
            continue
        whole = int(round(want)) if abs(want - round(want)) < 1e-9 else math.ceil(want)
        rounded += whole != want
        if cells["gpu_type"]:
            typed[gpu_type] = typed.get(gpu_type, 0) + 1
        job = SimJob(
            0,
            tenant,
            submit,
            duration,
            gang_of(whole),
            limit_s=limit,
            priority_class=klass,
            gpu_type=gpu_type,
            queue=queue or QUEUE,
            trace_id=trace_id,
        )
        parsed.append((submit, row, job))
    p.raise_if_any()
    if not parsed:
        raise TraceError(f"{path.name}: no jobs (a trace needs a header and at least one row)")
    parsed.sort(key=lambda x: (x[0], x[1]))  # submission order; file order breaks ties
    t0 = parsed[0][0]
    jobs = [job.but(index=k, submit=submit - t0) for k, (submit, _, job) in enumerate(parsed)]
    tenants = sorted({j.tenant for j in jobs})
    queues = {t: sorted({j.queue for j in jobs if j.tenant == t}) for t in tenants}
    w = Workload(
        jobs, dict.fromkeys(tenants, 0), f"trace {path.name}", rounded=rounded, queues=queues, type_constraints=typed
    )
    return w.split_by_demand(gpus if gpus else busy_gpus(w))


def busy_gpus(w: Workload) -> int:
    """Whole 8-GPU nodes' worth of GPUs that the workload keeps busy on average, at least its largest job."""
    largest = max((j.gpus for j in w.jobs), default=1)
    span = w.span_s()
    average = sum(j.gpus * j.duration for j in w.jobs) / span if span > 0 else largest
    return max(int(math.ceil(max(average, largest) / 8.0)) * 8, 8)


def load_nodes(path: Path_, cluster: str = "sim") -> list[NodeInfo]:
    """The nodes of a node-list file, in file order."""
    path = Path(path)
    p = _Problems(path.name)
    nodes: list[NodeInfo] = []
    seen: dict[str, int] = {}
    for row, c in enumerate(_rows(path, NODE_REQUIRED, NODE_OPTIONAL), start=1):
        if p.full:
            break
        before = p.count
        node_id = c["node_id"]
        if not node_id:
            p.add(row, "node_id", "is empty; every node needs an id")
        elif node_id in seen:
            p.add(row, "node_id", f"{node_id!r} is used twice (first on row {seen[node_id]}); node ids must be unique")
        else:
            seen[node_id] = row
        try:
            gpus = float(c["gpus"])
        except ValueError:
            gpus = math.nan
        if not math.isfinite(gpus) or gpus <= 0 or gpus != int(gpus):
            p.add(row, "gpus", f"{c['gpus']!r} is not a whole positive number of GPUs")
        if not GPU_TYPE_RE.match(c["gpu_model"]):
            p.add(
                row,
                "gpu_model",
                f"{c['gpu_model']!r} is not a GPU model name: letters, digits, '_' or '-', at most 32 (e.g. H100)",
            )
        for col in ("rack", "block"):
            if not c[col]:
                p.add(row, col, f"is empty; every node needs its {col} (the topology placement packs gangs into)")
        if p.count > before:
            continue
        nodes.append(
            NodeInfo(
                node_id=node_id,
                cluster=cluster,
                gpu_type=c["gpu_model"],
                gpus=int(gpus),
                zone=c["zone"] or "z1",
                block=c["block"],
                rack=c["rack"],
                nvlink_domain=c["nvlink_domain"] or None,
            )
        )
    p.raise_if_any()
    if not nodes:
        raise TraceError(f"{path.name}: no nodes (a node list needs a header and at least one row)")
    return nodes
