"""SGLang's native API: /generate (streamed or not), /flush_cache, /get_model_info.

Invariants: /generate answers what SGLang's does (``text``, ``meta_info`` with ``cached_tokens``),
plus ``output_ids`` (the generated ids, so a client can build the next turn from ids, exact
whatever the tokenizer); a stream's events carry the text so far (cumulative, as
SGLang streams it), the last one the whole ``meta_info`` and ``output_ids``, then ``[DONE]``; a
client that goes away cancels its generation, streamed or not (the engine frees its slot at its
next step).
/flush_cache (POST only: it changes state) empties the memory tiers as SGLang's does (refused with 400
while requests are in flight), after writing them down to the disk tier, which keeps them (as SGLang's
HiCache storage tier does); a page that cannot be written stays in memory, so nothing is lost. It needs
the API key when keys are configured, like everything but /health, and a tenant's flush empties only
its own namespace's pages (and waits only for its own requests): tenants never touch each other's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from anyio import to_thread
from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, PlainTextResponse

from chunkstore.cache.admin import MemorySelection
from chunkstore.engine import Request
from chunkstore.server import sse
from chunkstore.server.deps import CallerDep, EngineDep, InFlightDep, NamespaceHeader, ServedModelDep, authenticate
from chunkstore.server.errors import ApiError, error_responses
from chunkstore.server.handles import AsyncHandle
from chunkstore.server.sglang_schemas import GenerateRequest, GenerateResponse, MetaInfo, ModelInfo

router = APIRouter(tags=["sglang"], dependencies=[Depends(authenticate)])


@router.post("/generate", responses={200: {"model": GenerateResponse, **sse.OPENAPI_RESPONSE},
                                     **error_responses(400, 401, 413, 429, 503)})
async def generate(body: GenerateRequest, engine: EngineDep, caller: CallerDep, in_flight: InFlightDep,
                   http_request: HTTPRequest, namespace: NamespaceHeader = None):
    """Generate from ``text`` or ``input_ids`` with SGLang's ``sampling_params``; SSE with ``stream``."""
    try:
        params = body.sampling_params.engine_params()
    except ValueError as exc:
        raise ApiError.bad_request(str(exc), param="sampling_params") from exc
    prompt = {"prompt": body.text} if body.text is not None else {"token_ids": body.input_ids}
    request = Request(**prompt, params=params, namespace=caller.namespace(namespace))
    handle = await AsyncHandle.submit(engine, request, in_flight)
    rid = body.rid or uuid.uuid4().hex
    eos_ids = engine.tokenizer.eos_token_ids
    if body.stream:
        return sse.event_stream(handle, _generate_events(handle, rid, eos_ids))
    result = await handle.result_while_connected(http_request.receive)
    response = GenerateResponse(text=result.text, output_ids=list(result.token_ids),
                                meta_info=MetaInfo.of(rid, result, eos_ids))
    return JSONResponse(response.dump())


async def _generate_events(handle: AsyncHandle, rid: str, eos_ids: frozenset[int]) -> AsyncIterator[str]:
    text, num_tokens = "", 0
    async for delta in handle.deltas():
        # completion_tokens while streaming: the tokens whose text has been sent (a token whose
        # bytes end no character yet counts with the next piece); the last event is exact.
        text, num_tokens = text + delta, num_tokens + delta.num_tokens
        meta = MetaInfo(id=rid, finish_reason=None, prompt_tokens=handle.prompt_tokens,
                        completion_tokens=num_tokens)
        yield sse.event(GenerateResponse(text=text, meta_info=meta).dump())
    result = await handle.result()
    final = GenerateResponse(text=result.text, output_ids=list(result.token_ids),
                             meta_info=MetaInfo.of(rid, result, eos_ids))
    yield sse.event(final.dump())


_PLAIN_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}


@router.post("/flush_cache", response_class=PlainTextResponse,
             responses={200: {"description": "flushed: what went to disk and what left memory", **_PLAIN_TEXT},
                        400: {"description": "not flushed: requests are in flight (as SGLang answers)", **_PLAIN_TEXT},
                        **error_responses(401)})
async def flush_cache(engine: EngineDep, in_flight: InFlightDep, caller: CallerDep) -> PlainTextResponse:
    """Write the memory tiers down to disk, then empty them (a tenant's call: only its namespace's
    pages); 400 while requests (a tenant's: its own) are in flight."""
    namespace = caller.tenant.namespace if caller.tenant is not None else None
    if in_flight.count(namespace):
        return PlainTextResponse("Cache not flushed: requests are in flight; retry when they are done.\n",
                                 status_code=400)
    flushed = await to_thread.run_sync(_flush_and_clear, engine, namespace)
    return PlainTextResponse(flushed)


def _flush_and_clear(engine, namespace: str | None) -> str:
    """Write memory down, then drop it: every page, or (a tenant's flush) ``namespace``'s only."""
    lines = ["Cache flushed."]
    if engine.cache.store is None:
        lines.append("This server has no disk tier: nothing was written.")
    else:
        flushed = engine.flush()
        lines.append(f"{flushed.persisted_pages} pages on disk, {flushed.failed_pages} could not be written "
                     f"(those stay in memory).")
    if namespace is None:
        device, host = engine.cache.admin.clear("device"), engine.cache.admin.clear("host")
    else:  # a tenant empties its own memory, never another tenant's
        selection = MemorySelection(namespace=namespace)
        device, host = (engine.cache.admin.evict_selected(tier, selection).num_pages for tier in ("device", "host"))
    lines.append(f"{device} device and {host} host pages dropped from memory.")
    return "\n".join(lines) + "\n"


@router.get("/get_model_info", response_model=ModelInfo, responses=error_responses(401))
async def get_model_info(served: ServedModelDep) -> ModelInfo:
    return ModelInfo(model_path=served.path, tokenizer_path=served.path, served_model_name=served.name,
                     model_id=served.model_id, max_positions=served.max_positions, page_size=served.page_size)
