"""The OpenAI-compatible API under /v1: models, completions, chat completions (streamed or not).

Invariants: a request is checked (body, model, namespace) before anything is submitted; what the
engine refuses is answered with its 4xx before a stream starts, so a stream's status is 200 only
for a request the engine took; a request whose client goes away is cancelled (a stream's when its
response is cut, a whole answer's when its connection closes: the engine frees its slot at its
next step); a stream ends with a chunk carrying ``finish_reason``, then (with
``stream_options.include_usage``) a usage chunk with no choices, then ``[DONE]``; with
``include_usage`` every other chunk carries ``"usage": null``, as OpenAI's do; the OpenAPI spec
documents every status a route answers (errors.error_responses) and the stream's content type.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest

from chunkstore.engine import GenerationResult, Request, SamplingParams
from chunkstore.server import sse
from chunkstore.server.deps import (CallerDep, EngineDep, InFlightDep, NamespaceHeader, ServedModel, ServedModelDep,
                                    authenticate)
from chunkstore.server.errors import ApiError, error_responses
from chunkstore.server.handles import AsyncHandle
from chunkstore.server.openai_schemas import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                                              ChatCompletionResponse, ChatDelta, ChatMessageOut, CompletionChoice,
                                              CompletionRequest, CompletionResponse, ModelCard, ModelList, Usage)

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[Depends(authenticate)])

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# A generation's answers besides its JSON 200: server-sent events, and the errors it can get.
GENERATION_RESPONSES = {200: sse.OPENAPI_RESPONSE, **error_responses(400, 401, 404, 413, 429, 503)}


def _card(served: ServedModel) -> ModelCard:
    return ModelCard(id=served.name, created=served.created, max_model_len=served.max_positions)


@router.get("/models", response_model=ModelList, responses=error_responses(401))
async def list_models(served: ServedModelDep) -> ModelList:
    """The one model this server runs."""
    return ModelList(data=[_card(served)])


@router.get("/models/{model_name:path}", response_model=ModelCard, responses=error_responses(401, 404))
async def get_model(model_name: str, served: ServedModelDep) -> ModelCard:
    served.check(model_name)
    return _card(served)


def _sampling(body: CompletionRequest | ChatCompletionRequest, default_max_tokens: int) -> SamplingParams:
    try:
        return body.sampling_params(default_max_tokens=default_max_tokens)
    except ValueError as exc:  # the engine's own limits (e.g. temperature), named by its field
        raise ApiError.bad_request(str(exc)) from exc


def _ids(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex}", int(time.time())


@router.post("/completions", response_model=CompletionResponse, responses=GENERATION_RESPONSES)
async def create_completion(body: CompletionRequest, engine: EngineDep, served: ServedModelDep, caller: CallerDep,
                            in_flight: InFlightDep, http_request: HTTPRequest, namespace: NamespaceHeader = None):
    """Text completion of ``prompt`` (text or token ids); SSE chunks with ``stream``."""
    served.check(body.model)
    params = _sampling(body, COMPLETION_DEFAULT_MAX_TOKENS)
    prompt = {"prompt": body.prompt} if isinstance(body.prompt, str) else {"token_ids": body.prompt}
    request = Request(**prompt, params=params, namespace=caller.namespace(namespace, body.user))
    handle = await AsyncHandle.submit(engine, request, in_flight)
    completion_id, created = _ids("cmpl")
    if body.stream:
        return sse.event_stream(handle, _completion_events(handle, body, served, completion_id, created))
    result = await handle.result_while_connected(http_request.receive)
    return CompletionResponse(id=completion_id, created=created, model=served.name, usage=Usage.of(result),
                              choices=[CompletionChoice(text=result.text, finish_reason=result.finish_reason.value)])


async def _completion_events(handle: AsyncHandle, body: CompletionRequest, served: ServedModel,
                             completion_id: str, created: int) -> AsyncIterator[str]:
    exclude = None if body.include_usage else {"usage"}

    def chunk(text: str, finish_reason: str | None = None) -> str:
        c = CompletionResponse(id=completion_id, created=created, model=served.name,
                               choices=[CompletionChoice(text=text, finish_reason=finish_reason)])
        return sse.event(c.model_dump(exclude=exclude))

    async for delta in handle.deltas():
        yield chunk(delta)
    result = await handle.result()
    yield chunk("", result.finish_reason.value)
    if body.include_usage:
        yield sse.event(CompletionResponse(id=completion_id, created=created, model=served.name, choices=[],
                                           usage=Usage.of(result)).model_dump())


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=GENERATION_RESPONSES)
async def create_chat_completion(body: ChatCompletionRequest, engine: EngineDep, served: ServedModelDep,
                                 caller: CallerDep, in_flight: InFlightDep, http_request: HTTPRequest,
                                 namespace: NamespaceHeader = None):
    """The assistant's reply to ``messages`` (rendered with the model's chat template); SSE chunks
    with ``stream``. Without ``max_tokens`` it runs to an end token or the model's last position."""
    served.check(body.model)
    params = _sampling(body, served.max_positions)
    request = Request(messages=body.engine_messages(), params=params,
                      namespace=caller.namespace(namespace, body.user))
    handle = await AsyncHandle.submit(engine, request, in_flight)
    completion_id, created = _ids("chatcmpl")
    if body.stream:
        return sse.event_stream(handle, _chat_events(handle, body, served, completion_id, created))
    result = await handle.result_while_connected(http_request.receive)
    return _chat_response(result, served, completion_id, created)


def _chat_response(result: GenerationResult, served: ServedModel, completion_id: str,
                   created: int) -> ChatCompletionResponse:
    choice = ChatChoice(message=ChatMessageOut(content=result.text), finish_reason=result.finish_reason.value)
    return ChatCompletionResponse(id=completion_id, created=created, model=served.name, choices=[choice],
                                  usage=Usage.of(result))


async def _chat_events(handle: AsyncHandle, body: ChatCompletionRequest, served: ServedModel,
                       completion_id: str, created: int) -> AsyncIterator[str]:
    exclude = None if body.include_usage else {"usage"}

    def chunk(delta: ChatDelta, finish_reason: str | None = None) -> str:
        c = ChatCompletionChunk(id=completion_id, created=created, model=served.name,
                                choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)])
        return sse.event(c.model_dump(exclude=exclude))

    yield chunk(ChatDelta(role="assistant", content=""))
    async for delta in handle.deltas():
        yield chunk(ChatDelta(content=delta))
    result = await handle.result()
    yield chunk(ChatDelta(), result.finish_reason.value)
    if body.include_usage:
        yield sse.event(ChatCompletionChunk(id=completion_id, created=created, model=served.name, choices=[],
                                            usage=Usage.of(result)).model_dump())

