"""Write workloads and node lists in the trace formats (:mod:`trainyard.sim.traces`), and
convert the Philly trace into them."""

from __future__ import annotations

import csv
from pathlib import Path

from trainyard.domain.node import NodeInfo
from trainyard.sim.traces import NODE_OPTIONAL, NODE_REQUIRED, TRACE_COLUMNS, Path_, file_kind, parquet_modules
from trainyard.sim.workloads import GPU_TYPE, Workload, estimate_limit


def _write(path: Path, columns: tuple[str, ...], rows: list[dict], types: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if file_kind(path) == "parquet":
        pa, pq = parquet_modules()
        kinds = {"float": pa.float64(), "int": pa.int64(), "str": pa.string()}
        schema = pa.schema([(c, kinds[types[c]]) for c in columns])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        return
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(columns))
        out.writeheader()
        out.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)


def write_trace(workload: Workload, path: Path_) -> None:
    """``workload`` in the trace format (CSV or Parquet by suffix), one row per job.

    A run-time limit equal to the default estimate is written empty (the
    loader computes the same), and so is the default GPU type when no job
    asked for it by name.
    """
    rows = []
    for j in workload.jobs:
        any_type = j.gpu_type == GPU_TYPE and GPU_TYPE not in workload.type_constraints
        rows.append(
            {
                "submit_time": float(j.submit),
                "duration": float(j.duration),
                "gpus": j.gpus,
                "gpu_type": None if any_type else j.gpu_type,
                "tenant": j.tenant,
                "queue": j.queue,
                "priority_class": j.priority_class,
                "runtime_estimate": None if j.limit_s == estimate_limit(j.duration) else float(j.limit_s),
                "job_id": j.trace_id or j.job_id,
            }
        )
    types = dict.fromkeys(TRACE_COLUMNS, "str") | dict.fromkeys(
        ("submit_time", "duration", "gpus", "runtime_estimate"), "float"
    )
    _write(Path(path), TRACE_COLUMNS, rows, types)


def write_nodes(nodes: list[NodeInfo], path: Path_) -> None:
    """``nodes`` in the node-list format (CSV or Parquet by suffix)."""
    columns = (*NODE_REQUIRED, *NODE_OPTIONAL)
    rows = [
        {
            "node_id": n.node_id,
            "gpus": n.gpus,
            "gpu_model": n.gpu_type,
            "rack": n.rack,
            "block": n.block,
            "zone": n.zone,
            "nvlink_domain": n.nvlink_domain,
        }
        for n in nodes
    ]
    _write(Path(path), columns, rows, dict.fromkeys(columns, "str") | {"gpus": "int"})


def convert_philly(
    out: Path_,
    nodes_out: Path_ | None = None,
    traces: Path_ | None = None,
    start: str | None = None,
    end: str | None = None,
    limit: int | None = None,
) -> tuple[Workload, int]:
    """Write the jobs :func:`load_philly` gives as a trace file (and its cluster as a node list).

    The node list is the cluster ``trainyard sim --workload philly`` runs on:
    the VCs' 8-GPU nodes, in racks of 32.  Returns the workload and the number
    of nodes.
    """
    from trainyard.sim.cluster import build_nodes
    from trainyard.sim.workloads import load_philly

    w = load_philly(traces, start=start, end=end, limit=limit)
    write_trace(w, out)
    n = sum(w.quotas.values()) // 8
    if nodes_out is not None:
        write_nodes(build_nodes(n), nodes_out)
    return w, n
