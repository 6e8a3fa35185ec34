"""Console pages for jobs: my jobs (live), submit from a form or YAML, a job's
detail with its timeline and run history (live), why it waits, cancel.

Everything goes through :class:`~trainyard_gateway.jobs.JobOperations` and the
projections, with the same role and tenant checks as the REST API: a
researcher sees and acts on its own tenant only; another tenant's job is "not
found", as in the API.
"""

from __future__ import annotations

import asyncio
import time
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
from trainyard.store.job_pages import JobQuery
from trainyard_gateway.console.job_rows import may_be_cancelled, run_rows, runs_signature
from trainyard_gateway.console.live import Baselines, Events, stream
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import fragment, page
from trainyard_gateway.console.session import Forbidden, principal, read_form
from trainyard_gateway.console.submit_form import body_from_form, current_tenancy, form_context
from trainyard_gateway.decoding import decode_submission
from trainyard_gateway.jobs import Conflict, InvalidRequest, JobOperations, NotFound, check_job_id, check_tenant_name
from trainyard_gateway.logs_api import read_logs
from trainyard_gateway.metrics import JOB_STATUSES
from trainyard_gateway.schema import JobView
from trainyard_gateway.security import csrf_token

LIST_LIMIT = 200
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

    async def visible(who: Principal, tenant: str | None, status: str | None, archived: bool = False) -> list[JobView]:
        """The newest jobs the caller may see; ``archived``: the job archive's too (finished past their retention)."""
        scope = tenant_filter(who, Action.JOB_LIST, tenant or None)
        if archived:
            jobs, _ = await ops.page(JobQuery(tenant=scope, status=status or None), LIST_LIMIT, archived=True)
            return jobs
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
        return may_be_cancelled(job)

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
        runs = run_rows(job, await runs_of(job.job_id) if job is not None else [], time.time())
        output, output_note = await output_tail(who, job)
        return {
            "job": job,
            "runs": runs,
            "runs_seen": runs_signature(runs),
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
    async def jobs_page(request: Request, status: str = "", tenant: str = "", archived: str = "") -> Response:
        who = principal(request)
        status = status if status in JOB_STATUSES else ""
        if check_tenant_name(tenant or None):
            tenant = ""
        try:
            jobs = await visible(who, tenant, status, archived == "1")
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
            archived=archived == "1",
            statuses=JOB_STATUSES,
            filtered=bool(status or tenant),
            view=view,
            counts=await ops.caught_up.read(lambda: views.status_counts(ops.store)) if who.tenant is None else None,
        )

    @router.get("/stream")
    async def jobs_stream(
        request: Request, view: str = "", status: str = "", tenant: str = "", archived: str = ""
    ) -> Response:
        who = principal(request)
        status = status if status in JOB_STATUSES else ""
        tenant = "" if check_tenant_name(tenant or None) else tenant
        shown = baselines.take(view)

        async def poll() -> Events:
            nonlocal shown
            jobs = await visible(who, tenant, status, archived == "1")
            now = {j.job_id: row_signature(j) for j in jobs}
            before, shown = shown, now
            if before is None or list(before) != list(now):  # rows came or went: the whole table
                return [("jobs-table", fragment("_job_rows.html", jobs=jobs, who=who, filtered=bool(status or tenant)))]
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
        return page(request, "job_new.html", who, **form_context(who, await current_tenancy(ops.bus), {}, []))

    @router.post("/new")
    @answers_rebuilding
    async def submit(request: Request) -> Response:
        who = principal(request)
        try:
            fields = await read_form(request)
        except Forbidden as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        try:
            body = decode_submission(msgspec.json.encode(body_from_form(who, fields)))
            spec = body.job_spec()
            tenant_filter(who, Action.JOB_SUBMIT, spec.tenant)
            job_id = await ops.submit(spec, body.job_id, actor=who.actor)
        except InvalidRequest as err:
            context = form_context(who, await current_tenancy(ops.bus), fields, err.errors)
            return page(request, "job_new.html", who, status_code=422, **context)
        except (PermissionDenied, Conflict) as err:
            problem = [ValidationError("tenant" if isinstance(err, PermissionDenied) else "job_id", str(err))]
            context = form_context(who, await current_tenancy(ops.bus), fields, problem)
            return page(request, "job_new.html", who, status_code=403, **context)
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
        context = await detail_context(who, job)
        view = baselines.keep({job_id: f"{detail_signature(job)}#{context['runs_seen']}"})
        return page(request, "job.html", who, job_id=job_id, view=view, **context)

    @router.get("/{job_id}/stream")
    async def job_stream(request: Request, job_id: str, view: str = "") -> Response:
        who = principal(request)
        if check_job_id(job_id):
            return page(request, "error.html", who, status_code=404, message=f"no job {job_id!r}")
        shown = (baselines.take(view) or {}).get(job_id)

        async def poll() -> Events:
            nonlocal shown
            job = await read_job(who, job_id)
            runs = run_rows(job, await runs_of(job_id) if job is not None else [], time.time())
            now = f"{detail_signature(job)}#{runs_signature(runs)}"
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

    async def confirm_cancel(request: Request, who: Principal, job_id: str, reason: str = "") -> Response:
        """The page that asks whether to cancel, naming the job and its GPUs."""
        job = await read_job(who, job_id) if not check_job_id(job_id) else None
        if job is None:
            return page(request, "error.html", who, status_code=404, message=f"no job {job_id!r}")
        if not may_cancel(who, job):
            message = f"job {job_id} is {job.status}: only a pending, admitted, placed or running job can be cancelled"
            return page(request, "error.html", who, status_code=409, message=message)
        return page(request, "job_cancel.html", who, job=job, reason=reason)

    @router.get("/{job_id}/cancel")
    @answers_rebuilding
    async def cancel_page(request: Request, job_id: str) -> Response:
        who = principal(request)
        try:
            tenant_filter(who, Action.JOB_CANCEL, None)
        except PermissionDenied as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        return await confirm_cancel(request, who, job_id)

    @router.post("/{job_id}/cancel")
    @answers_rebuilding
    async def cancel(request: Request, job_id: str) -> Response:
        """Cancels once the confirmation page's form names the job; a form
        without that confirmation gets the confirmation page."""
        who = principal(request)
        try:
            fields = await read_form(request)
            scope = tenant_filter(who, Action.JOB_CANCEL, None)
            if fields.get("confirm") != job_id:
                return await confirm_cancel(request, who, job_id, (fields.get("reason") or "").strip()[:256])
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
