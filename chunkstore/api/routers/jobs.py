"""POST /jobs/verify, /jobs/rebuild, /jobs/gc (background, one of a kind at a time: 409 otherwise),
GET /jobs and GET /jobs/{id} (progress, then the result or the error).

Invariant: ``/jobs/{id}`` never takes a job kind's name (a path convertor; the spec says so too),
so ``GET /jobs/gc`` is the gc resource's 405 (``Allow: POST``), not a search for a job named "gc"."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Request
from starlette.convertors import StringConvertor, register_url_convertor

from chunkstore.api.deps import AdminDep, GlobalReaderDep, RuntimeDep, audit, require_reader
from chunkstore.api.errors import ERROR_RESPONSES, AdminError
from chunkstore.api.jobs import JobConflictError, JobKind
from chunkstore.api.runtime import AdminRuntime
from chunkstore.api.schemas.jobs import GcParams, JobList, JobPublic, RebuildParams, VerifyParams

router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(require_reader)], responses=ERROR_RESPONSES)

_KINDS = [kind.value for kind in JobKind]


class _JobIdConvertor(StringConvertor):
    """A path segment that is not the name of a job kind (those are resources of their own)."""

    regex = rf"(?!(?:{'|'.join(_KINDS)})$)[^/]+"


register_url_convertor("job_id", _JobIdConvertor())  # Starlette's convertors are one table, keyed by name


def _start(request: Request, caller, runtime: AdminRuntime, kind: JobKind, params: dict,
           *, needs_write: bool) -> JobPublic:
    try:
        runtime.jobs.check_can_start(kind)
        if kind is JobKind.REBUILD:
            runtime.backend.check_rebuild()
        with runtime.backend.using_store(write=needs_write):
            pass  # no disk tier or a read-only store: answer now, not in the job
        job = runtime.jobs.start(kind, params)
    except JobConflictError as exc:
        raise AdminError.conflict(str(exc)) from None
    audit(request, caller, {"job": job.id, **params}, is_destructive=needs_write)
    return JobPublic.of(job)


@router.post("/verify", response_model=JobPublic, status_code=202)
def start_verify(request: Request, caller: AdminDep, runtime: RuntimeDep,
                 params: Annotated[VerifyParams | None, Body()] = None) -> JobPublic:
    """Read and verify every chunk (`chunkstore verify`); with repair, fix what is found."""
    params = params or VerifyParams()
    return _start(request, caller, runtime, JobKind.VERIFY, params.model_dump(), needs_write=params.repair)


@router.post("/rebuild", response_model=JobPublic, status_code=202)
def start_rebuild(request: Request, caller: AdminDep, runtime: RuntimeDep,
                  params: Annotated[RebuildParams | None, Body()] = None) -> JobPublic:
    """Recreate the index from the chunk files (`chunkstore rebuild`); offline stores only. Other
    requests get 503 until it ends; hits, access times and pins start afresh."""
    return _start(request, caller, runtime, JobKind.REBUILD, {}, needs_write=True)


@router.post("/gc", response_model=JobPublic, status_code=202)
def start_gc(request: Request, caller: AdminDep, runtime: RuntimeDep,
             params: Annotated[GcParams | None, Body()] = None) -> JobPublic:
    """Remove leftover temp files, evict down to disk_size_bytes, purge quarantine, checkpoint (`chunkstore gc`)."""
    params = params or GcParams()
    return _start(request, caller, runtime, JobKind.GC, params.model_dump(), needs_write=True)


@router.get("", response_model=JobList)
def list_jobs(caller: GlobalReaderDep, runtime: RuntimeDep) -> JobList:
    """Running jobs and the most recent finished ones, oldest first."""
    return JobList(items=[JobPublic.of(j) for j in runtime.jobs.list()])


@router.get("/{job_id:job_id}", response_model=JobPublic)
def get_job(job_id: Annotated[str, Path(max_length=64, json_schema_extra={"not": {"enum": _KINDS}})],
            caller: GlobalReaderDep, runtime: RuntimeDep) -> JobPublic:
    job = runtime.jobs.get(job_id)
    if job is None:
        raise AdminError.not_found(f"no job {job_id} (finished jobs are kept for a while only)", "job_id")
    return JobPublic.of(job)
