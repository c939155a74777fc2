"""SGLang's native API: /generate (streamed or not), /flush_cache, /get_model_info.

Invariants: /generate answers what SGLang's does (``text``, ``meta_info`` with ``cached_tokens``),
plus ``output_ids`` (the generated ids, so a client can build the next turn from ids: a random
model's bytes are rarely valid UTF-8); a stream's events carry the text so far (cumulative, as
SGLang streams it), the last one the whole ``meta_info`` and ``output_ids``, then ``[DONE]``.
/flush_cache writes the cache's memory tiers down to disk and keeps them (nothing is dropped: the
cache has no "clear"); it needs the API key when keys are configured, like everything but /health.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from anyio import to_thread
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse

from chunkstore.engine import Request
from chunkstore.server import sse
from chunkstore.server.deps import CallerDep, EngineDep, InFlightDep, NamespaceHeader, ServedModelDep, authenticate
from chunkstore.server.errors import ApiError
from chunkstore.server.handles import AsyncHandle
from chunkstore.server.sglang_schemas import GenerateRequest, GenerateResponse, MetaInfo, ModelInfo

router = APIRouter(tags=["sglang"], dependencies=[Depends(authenticate)])


@router.post("/generate", responses={200: {"model": GenerateResponse}})
async def generate(body: GenerateRequest, engine: EngineDep, caller: CallerDep, in_flight: InFlightDep,
                   namespace: NamespaceHeader = None):
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
    result = await handle.result()
    response = GenerateResponse(text=result.text, output_ids=list(result.token_ids),
                                meta_info=MetaInfo.of(rid, result, eos_ids))
    return JSONResponse(response.dump())


async def _generate_events(handle: AsyncHandle, rid: str, eos_ids: frozenset[int]) -> AsyncIterator[str]:
    text, pieces = "", 0
    async for delta in handle.deltas():
        text, pieces = text + delta, pieces + 1
        # completion_tokens while streaming counts text pieces (a piece is one or more tokens);
        # the last event has the exact count.
        meta = MetaInfo(id=rid, finish_reason=None, prompt_tokens=handle.prompt_tokens, completion_tokens=pieces)
        yield sse.event(GenerateResponse(text=text, meta_info=meta).dump())
    result = await handle.result()
    final = GenerateResponse(text=result.text, output_ids=list(result.token_ids),
                             meta_info=MetaInfo.of(rid, result, eos_ids))
    yield sse.event(final.dump())


@router.api_route("/flush_cache", methods=["GET", "POST"], response_class=PlainTextResponse)
async def flush_cache(engine: EngineDep) -> PlainTextResponse:
    """Write every page the memory tiers hold down to disk and wait (the pages stay cached)."""
    if engine.cache.store is None:
        return PlainTextResponse("Cache flushed.\nThis server has no disk tier: nothing was written.\n")
    flushed = await to_thread.run_sync(engine.flush)
    return PlainTextResponse(f"Cache flushed.\n{flushed.persisted_pages} pages on disk, "
                             f"{flushed.failed_pages} could not be written.\n")


@router.get("/get_model_info", response_model=ModelInfo)
async def get_model_info(served: ServedModelDep) -> ModelInfo:
    return ModelInfo(model_path=served.path, tokenizer_path=served.path, served_model_name=served.name,
                     model_id=served.model_id, max_positions=served.max_positions, page_size=served.page_size)
