"""Console pages for jobs: my jobs (live), submit from a form or YAML, a job's
detail with its timeline and run history (live), why it waits, cancel.

Everything goes through :class:`~trainyard_gateway.jobs.JobOperations` and the
projections, with the same role and tenant checks as the REST API: a
researcher sees and acts on its own tenant only; another tenant's job is "not
found", as in the API.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import msgspec
import nats.errors
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action, PermissionDenied, Principal, tenant_filter
from trainyard.domain.job import ValidationError
from trainyard.ledger import Ledger
from trainyard.ledger.records import LedgerRun
from trainyard.store import views
from trainyard.store.views import TERMINAL
from trainyard.yaml_input import YamlTooLarge, check_yaml
from trainyard_gateway.console.live import Baselines, Events, stream
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import fragment, page
from trainyard_gateway.console.session import Forbidden, principal, read_form
from trainyard_gateway.decoding import decode_submission
from trainyard_gateway.jobs import Conflict, InvalidRequest, JobOperations, NotFound, check_job_id, check_tenant_name
from trainyard_gateway.logs_api import read_logs
from trainyard_gateway.metrics import JOB_STATUSES
from trainyard_gateway.schema import JobView
from trainyard_gateway.security import csrf_token

LIST_LIMIT = 200
GPU_TYPES = ("H100", "A100", "H200", "B200")
EXAMPLE_YAML = """\
name: llama-7b
queue: default
priority_class: standard
roles:
  - name: trainer
    replicas: 2
    gpus_per_replica: 8
    gpu_type: H100
simulated_duration_s: 30
"""

OUTPUT_TAIL = 4096  # bytes of rank 0's output shown on a job's page


def row_signature(job: JobView) -> str:
    """What a row shows that can change."""
    return f"{job.status}|{job.reason}|{job.position}|{job.attempt}|{job.run_id}|{job.expected_start}|{job.finished_at}"


def detail_signature(job: JobView | None) -> str:
    if job is None:
        return "absent"
    return f"{row_signature(job)}|{job.placed_at}|{job.started_at}|{job.admitted_at}|{job.requeues}"


def timeline(job: JobView) -> list[tuple[str, float]]:
    """The job's milestones in order, as the projection recorded them."""
    steps = [
        ("submitted", job.submitted_at),
        ("accepted", job.accepted_at),
        ("admitted", job.admitted_at),
        ("placed", job.placed_at),
        ("running", job.started_at),
        (job.status, job.finished_at),
    ]
    return [(name, at) for name, at in steps if at is not None]


def build_router(ops: JobOperations, ledger: Callable[[], Ledger] | None) -> APIRouter:
    router = APIRouter(prefix="/jobs", include_in_schema=False)
    baselines = Baselines()

    async def visible(who: Principal, tenant: str | None, status: str | None) -> list[JobView]:
        scope = tenant_filter(who, Action.JOB_LIST, tenant or None)
        return await ops.list(tenant=scope, status=status or None, limit=LIST_LIMIT)

    async def runs_of(job_id: str) -> list[LedgerRun]:
        if ledger is None:
            return []
        opened = ledger
        return await asyncio.to_thread(lambda: opened().runs(job_id=job_id))

    def may_cancel(who: Principal, job: JobView) -> bool:
        try:
            tenant_filter(who, Action.JOB_CANCEL, None)
        except PermissionDenied:
            return False
        return job.status not in TERMINAL

    async def output_tail(who: Principal, job: JobView | None) -> tuple[str | None, str | None]:
        """The last few KiB of rank 0's output of the latest attempt, or why there is none."""
        if job is None or not job.attempt or job.status in ("rejected", "admitted"):
            return None, None
        try:
            chunk = await read_logs(ops, job.job_id, tenant_filter(who, Action.JOB_READ, None), offset=-OUTPUT_TAIL)
        except (InvalidRequest, Conflict, NotFound, nats.errors.Error) as err:
            return None, str(err) if not isinstance(err, InvalidRequest) else "; ".join(map(str, err.errors))
        return chunk.data, None

    async def detail_context(who: Principal, job: JobView | None) -> dict[str, Any]:
        runs = await runs_of(job.job_id) if job is not None else []
        output, output_note = await output_tail(who, job)
        return {
            "job": job,
            "runs": runs,
            "output": output,
            "output_note": output_note,
            "steps": timeline(job) if job else [],
            "can_cancel": job is not None and may_cancel(who, job),
        }

    async def read_job(who: Principal, job_id: str) -> JobView | None:
        try:
            return await ops.get(job_id, tenant_filter(who, Action.JOB_READ, None))
        except NotFound:
            return None

    @router.get("")
    @answers_rebuilding
    async def jobs_page(request: Request, status: str = "", tenant: str = "") -> Response:
        who = principal(request)
        status = status if status in JOB_STATUSES else ""
        if check_tenant_name(tenant or None):
            tenant = ""
        try:
            jobs = await visible(who, tenant, status)
        except PermissionDenied as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        view = baselines.keep({j.job_id: row_signature(j) for j in jobs})
        return page(
            request,
            "jobs.html",
            who,
            jobs=jobs,
            status=status,
            tenant=tenant,
            statuses=JOB_STATUSES,
            view=view,
            counts=await ops.caught_up.read(lambda: views.status_counts(ops.store)) if who.tenant is None else None,
        )

    @router.get("/stream")
    async def jobs_stream(request: Request, view: str = "", status: str = "", tenant: str = "") -> Response:
        who = principal(request)
        status = status if status in JOB_STATUSES else ""
        tenant = "" if check_tenant_name(tenant or None) else tenant
        shown = baselines.take(view)

        async def poll() -> Events:
            nonlocal shown
            jobs = await visible(who, tenant, status)
            now = {j.job_id: row_signature(j) for j in jobs}
            before, shown = shown, now
            if before is None or list(before) != list(now):  # rows came or went: the whole table
                return [("jobs-table", fragment("_job_rows.html", jobs=jobs, who=who))]
            return [
                (f"job-{j.job_id}", fragment("_job_row.html", job=j)) for j in jobs if before[j.job_id] != now[j.job_id]
            ]

        try:
            tenant_filter(who, Action.JOB_LIST, tenant or None)
        except PermissionDenied as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        return stream(request, poll)

    @router.get("/new")
    async def new_job_page(request: Request) -> Response:
        who = principal(request)
        if not _may_submit(who):
            return page(request, "error.html", who, status_code=403, message=f"{who} may not submit jobs")
        return page(request, "job_new.html", who, **_form_context(who, {}, []))

    @router.post("/new")
    @answers_rebuilding
    async def submit(request: Request) -> Response:
        who = principal(request)
        try:
            fields = await read_form(request)
        except Forbidden as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        try:
            body = decode_submission(msgspec.json.encode(_body_from_form(who, fields)))
            spec = body.job_spec()
            tenant_filter(who, Action.JOB_SUBMIT, spec.tenant)
            job_id = await ops.submit(spec, body.job_id, actor=who.actor)
        except InvalidRequest as err:
            return page(request, "job_new.html", who, status_code=422, **_form_context(who, fields, err.errors))
        except (PermissionDenied, Conflict) as err:
            problem = [ValidationError("tenant" if isinstance(err, PermissionDenied) else "job_id", str(err))]
            return page(request, "job_new.html", who, status_code=403, **_form_context(who, fields, problem))
        return RedirectResponse(f"/jobs/{job_id}?submitted=1", status_code=303)

    @router.get("/{job_id}")
    @answers_rebuilding
    async def job_page(request: Request, job_id: str, submitted: int = 0) -> Response:
        who = principal(request)
        if check_job_id(job_id):
            return page(request, "error.html", who, status_code=404, message=f"no job {job_id!r}")
        try:
            job = await read_job(who, job_id)
        except PermissionDenied as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        if job is None and not submitted:
            return page(request, "error.html", who, status_code=404, message=f"no job {job_id!r}")
        view = baselines.keep({job_id: detail_signature(job)})
        return page(request, "job.html", who, job_id=job_id, view=view, **await detail_context(who, job))

    @router.get("/{job_id}/stream")
    async def job_stream(request: Request, job_id: str, view: str = "") -> Response:
        who = principal(request)
        if check_job_id(job_id):
            return page(request, "error.html", who, status_code=404, message=f"no job {job_id!r}")
        shown = (baselines.take(view) or {}).get(job_id)

        async def poll() -> Events:
            nonlocal shown
            job = await read_job(who, job_id)
            now = detail_signature(job)
            if now == shown:
                return []
            shown = now
            return [
                (
                    "job",
                    fragment("_job_detail.html", **await detail_context(who, job), who=who, csrf=csrf_token(request)),
                )
            ]

        return stream(request, poll)

    @router.post("/{job_id}/cancel")
    @answers_rebuilding
    async def cancel(request: Request, job_id: str) -> Response:
        who = principal(request)
        try:
            fields = await read_form(request)
            scope = tenant_filter(who, Action.JOB_CANCEL, None)
            reason = (fields.get("reason") or "").strip()[:256] or "cancelled from the console"
            await ops.cancel(job_id, scope, reason, actor=who.actor)
        except (Forbidden, PermissionDenied) as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        except NotFound:
            return page(request, "error.html", who, status_code=404, message=f"no job {job_id!r}")
        except InvalidRequest as err:
            return page(request, "error.html", who, status_code=422, message=str(err))
        except Conflict as err:
            return page(request, "error.html", who, status_code=409, message=str(err))
        return RedirectResponse(f"/jobs/{job_id}", status_code=303)

    return router


def _may_submit(who: Principal) -> bool:
    try:
        tenant_filter(who, Action.JOB_SUBMIT, None)
    except PermissionDenied:
        return False
    return True


def _form_context(who: Principal, fields: dict[str, str], errors: list[ValidationError]) -> dict[str, Any]:
    defaults = {
        "mode": "form",
        "tenant": who.tenant or "",
        "queue": "default",
        "name": "job",
        "replicas": "1",
        "gpus_per_replica": "8",
        "gpu_type": "H100",
        "priority_class": "standard",
        "duration": "30",
        "image": "",
        "job_id": "",
        "yaml": EXAMPLE_YAML,
    }
    return {
        "form": defaults | {k: v for k, v in fields.items() if k in defaults},
        "errors": errors,
        "gpu_types": GPU_TYPES,
    }


def _int(fields: dict[str, str], name: str) -> int | str:
    """The field as a whole number when it is ASCII digits (so '²', which
    ``str.isdigit`` accepts, stays text), else as sent, for the API to refuse."""
    value = fields.get(name, "").strip()
    return int(value) if _DIGITS.fullmatch(value) else value


_DIGITS = re.compile(r"[0-9]{1,12}")
#: How deep a job spec written as YAML may nest: a real one is four or five levels.
MAX_YAML_DEPTH = 32


def _yaml_problem(body: Any) -> str | None:
    """Why the decoded YAML cannot be a JSON job spec: a key that is not text
    (``~: 1``, ``yes: 1``, ``1: x``), or nesting past :data:`MAX_YAML_DEPTH`."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_YAML_DEPTH:
            return f"nested more than {MAX_YAML_DEPTH} levels deep; a job spec is a few levels deep"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    where = f" in {path}" if path else ""
                    return f"every key must be text, but {key!r}{where} is not (quote it)"
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
    return None


def _body_from_form(who: Principal, fields: dict[str, str]) -> dict[str, Any]:
    """The submission as the REST API takes it, from the form or its YAML;
    a tenant-bound caller's tenant is its own unless the YAML names another
    (which is then refused, as the API refuses it)."""
    if fields.get("mode") == "yaml":
        try:
            text = fields.get("yaml", "").encode()
            check_yaml(text, "the job spec")
            body = msgspec.yaml.decode(text)
        except YamlTooLarge as err:
            raise InvalidRequest([ValidationError("yaml", str(err))]) from None
        except msgspec.DecodeError as err:
            raise InvalidRequest([ValidationError("yaml", f"not valid YAML: {err}")]) from None
        except RecursionError:
            raise InvalidRequest(
                [ValidationError("yaml", "nested too deeply; a job spec is a few levels deep")]
            ) from None
        problem = _yaml_problem(body)
        if problem:
            raise InvalidRequest([ValidationError("yaml", problem)])
        if not isinstance(body, dict):
            raise InvalidRequest([ValidationError("yaml", "give one job spec: a mapping with tenant, queue and roles")])
        body.setdefault("tenant", who.tenant or fields.get("tenant") or "")
        return body
    body: dict[str, Any] = {
        "tenant": who.tenant or fields.get("tenant", "").strip(),
        "queue": fields.get("queue", "").strip() or "default",
        "name": fields.get("name", "").strip() or "job",
        "priority_class": fields.get("priority_class", "").strip() or "standard",
        "roles": [
            {
                "name": "trainer",
                "replicas": _int(fields, "replicas"),
                "gpus_per_replica": _int(fields, "gpus_per_replica"),
                "gpu_type": fields.get("gpu_type", "H100"),
            }
        ],
    }
    duration, image = fields.get("duration", "").strip(), fields.get("image", "").strip()
    if image:
        body["image"] = image
    if duration:
        try:
            body["simulated_duration_s"] = float(duration)
        except ValueError:
            raise InvalidRequest([ValidationError("duration", f"{duration!r} is not a number of seconds")]) from None
    if fields.get("job_id", "").strip():
        body["job_id"] = fields["job_id"].strip()
    return body
