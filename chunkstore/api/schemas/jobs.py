"""The job family: parameters per kind, results per kind, JobPublic (GET /jobs/{id})."""

from __future__ import annotations

from pydantic import BaseModel, Field

from chunkstore.api.jobs import Job, JobKind, JobState
from chunkstore.api.schemas.common import RequestBody, size_bytes
from chunkstore.http.json_types import JsonBool


class VerifyParams(RequestBody):
    repair: JsonBool = Field(False, description="quarantine corrupt files, drop rows of missing ones, adopt orphans")


class RebuildParams(RequestBody):
    pass


class GcParams(RequestBody):
    purge_quarantine: JsonBool = False
    disk_size_bytes: size_bytes(ge=1) | None = Field(None, description="evict down to this many stored bytes")


class VerifyResult(BaseModel):
    checked: int
    ok: int
    corrupt: int
    missing: int
    quarantined: int
    rows_dropped: int
    orphans: int = Field(description="chunk files without an index row (what a crash leaves)")
    adopted: int
    temps: int = Field(description="leftover temp files (not puts in flight)")
    temps_removed: int


class RebuildResult(BaseModel):
    scanned: int
    indexed: int
    quarantined: int


class GcResult(BaseModel):
    temps_removed: int
    evicted_chunks: int
    evicted_bytes: int
    quarantine_purged: int
    lapsed_claims: int = Field(0, description="a shared tier's publish claims of dead writers, taken over and dropped")
    swept_objects: int = Field(0, description="a shared tier's objects without a row (dead writers' uploads, "
                                              "old orphans), deleted")


_RESULTS = {JobKind.VERIFY: VerifyResult, JobKind.REBUILD: RebuildResult, JobKind.GC: GcResult}


class JobProgress(BaseModel):
    done: int
    total: int | None = Field(description="None while unknown (a rebuild counts files as it finds them)")
    fraction: float | None


class JobPublic(BaseModel):
    id: str
    kind: JobKind
    state: JobState
    params: dict[str, bool | int | None]
    progress: JobProgress
    created_at: float
    finished_at: float | None
    result: VerifyResult | RebuildResult | GcResult | None
    error: str | None

    @classmethod
    def of(cls, job: Job) -> "JobPublic":
        fraction = min(1.0, job.done / job.total) if job.total else (1.0 if job.total == 0 else None)
        result = _RESULTS[job.kind](**job.result) if job.result is not None else None
        return cls(id=job.id, kind=job.kind, state=job.state, params=job.params,
                   progress=JobProgress(done=job.done, total=job.total, fraction=fraction),
                   created_at=job.created_at, finished_at=job.finished_at, result=result, error=job.error)


class JobList(BaseModel):
    items: list[JobPublic]
