"""The OpenAI API's request and response bodies: completions, chat completions, models, usage.

Invariants: a request body that validates can be served exactly as asked: every field the engine
cannot honour is refused (400 naming it) unless it has its neutral value (``n`` 1, no logprobs, no
penalties, no tools, ...), and the spec lists those values only; types are JSON's, strictly, as
OpenAI reads them (no ``true`` for a number, no ``"5"`` for an integer: request_fields.py); unknown
fields are ignored, as OpenAI-compatible servers do; ``usage`` always carries
``prompt_tokens_details.cached_tokens`` and, as an extension, where the cached tokens were found
(``cached_tokens_details``: device, host, disk; they sum to ``cached_tokens``); every request model
is a ``RequestBody`` (request_fields.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_serializer, field_validator

from chunkstore.engine import GenerationResult, SamplingParams
from chunkstore.engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS
from chunkstore.http.json_types import JsonBool, JsonFloat, JsonInt, json_int
from chunkstore.server.request_fields import (NamespaceText, PromptText, RequestBody, Stop, TokenIds, neutral_fields,
                                              neutral_value, one_of_batch, one_prompt, stop_list)

SEED_MODULUS = 2**63  # the engine's seeds are below it; a larger seed is taken modulo it

# Fields accepted only at their neutral value: the values a request may carry, and why anything else fails.
_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((None, 1), "only n=1 is supported: one choice per request"),
    "best_of": ((None, 1), "best_of is not supported"),
    "echo": ((None, False), "echo is not supported"),
    "suffix": ((None, ""), "suffix is not supported"),
    "logprobs": ((None, False, 0), "logprobs are not supported"),
    "top_logprobs": ((None, 0), "top_logprobs are not supported"),
    "presence_penalty": ((None, 0), "presence_penalty is not supported (send 0)"),
    "frequency_penalty": ((None, 0), "frequency_penalty is not supported (send 0)"),
    "logit_bias": ((None, {}), "logit_bias is not supported"),
    "tools": ((None, []), "tools are not supported"),
    "functions": ((None, []), "functions are not supported"),
}


class StreamOptions(RequestBody):
    include_usage: JsonBool = False


class _GenerationBody(RequestBody):
    """What completions and chat completions share."""

    model_config = ConfigDict(json_schema_extra=neutral_fields(_NEUTRAL))

    model: str | None = Field(None, description="the served model's name (GET /v1/models); optional")
    max_tokens: json_int(ge=0) | None = Field(
        None, description="tokens to generate at most (capped to what the model's positions leave after the prompt)")
    temperature: Annotated[JsonFloat, Field(ge=0, le=2)] | None = Field(
        None, description="below 1e-5 (0 included) = greedy (default 1)")
    top_p: Annotated[JsonFloat, Field(gt=0, le=1)] | None = Field(None, description="nucleus sampling mass (default 1)")
    stop: Stop = Field([], description=f"strings that end the generation (not returned): at most "
                                       f"{MAX_STOP_STRINGS}, each 1-{MAX_STOP_CHARS} characters")
    seed: json_int(ge=0) | None = Field(
        None, description="makes sampling reproducible (taken modulo 2^63)")
    stream: JsonBool = False
    stream_options: StreamOptions | None = None
    user: NamespaceText | None = Field(None, description="the cache namespace, when the server has no API keys and "
                                                         "no X-Chunkstore-Namespace header is sent (empty: not given)")
    ignore_eos: JsonBool = Field(False, description="extension: keep generating past end-of-sequence tokens")
    n: JsonInt | None = None
    logprobs: Any = None
    top_logprobs: JsonInt | None = None
    presence_penalty: JsonFloat | None = None
    frequency_penalty: JsonFloat | None = None
    logit_bias: dict[str, JsonFloat] | None = None

    @field_validator(*_NEUTRAL, mode="before", check_fields=False)
    @classmethod
    def _neutral_only(cls, value: Any, info: ValidationInfo) -> Any:
        return neutral_value(_NEUTRAL, info.field_name, value)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> Any:
        return stop_list(value)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        """The ``max_tokens`` the body asks for (None: not given)."""
        return self.max_tokens

    def sampling_params(self, *, default_max_tokens: int) -> SamplingParams:
        requested = self.requested_max_tokens()
        max_tokens = requested if requested is not None else default_max_tokens
        return SamplingParams(max_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, stop=tuple(self.stop or ()),
                              seed=None if self.seed is None else self.seed % SEED_MODULUS,
                              ignore_eos=self.ignore_eos)


class CompletionRequest(_GenerationBody):
    """POST /v1/completions. ``prompt``: text, or token ids; a list of one of either is taken as that one."""

    prompt: PromptText | TokenIds | one_of_batch(PromptText) | one_of_batch(TokenIds) = Field(
        description="text or token ids (a batch of one is taken as that one); never empty")
    best_of: JsonInt | None = None
    echo: JsonBool | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        return one_prompt(value, "prompt")


class TextPart(RequestBody):
    """A part of a message's content; only text parts are supported."""

    type: Literal["text"]
    text: str


class ChatMessage(RequestBody):
    """One message; ``content`` is text, or a list of text parts (joined)."""

    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"only text content parts are supported ({{'type': 'text', 'text': ...}}), "
                                 f"got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)


class ResponseFormat(RequestBody):
    """Only the text format is supported."""

    type: Literal["text"] = "text"


class ChatCompletionRequest(_GenerationBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: json_int(ge=0) | None = Field(
        None, description="newer name of max_tokens; wins over it")
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: ResponseFormat | None = None

    @field_validator("response_format", mode="before")
    @classmethod
    def _text_format(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type", "text") != "text":
            raise ValueError("only the text response format is supported")
        return value

    def engine_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content or ""} for m in self.messages]

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- responses ------------------------------------------------------------------------------------

class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CachedTokensDetails(BaseModel):
    """Extension: the tier each cached prompt token was found on (before it was loaded to the device)."""

    device: int
    host: int
    disk: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    cached_tokens_details: CachedTokensDetails

    @classmethod
    def of(cls, result: GenerationResult) -> "Usage":
        return cls(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                   total_tokens=result.prompt_tokens + result.completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=result.cached_tokens),
                   cached_tokens_details=CachedTokensDetails(device=result.device_tokens, host=result.host_tokens,
                                                             disk=result.disk_tokens))


FinishReasonName = Literal["stop", "length", "abort"]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReasonName | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: FinishReasonName


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishReasonName | None = None

    @field_serializer("delta")
    def _only_set(self, delta: ChatDelta) -> dict:
        return delta.model_dump(exclude_none=True)  # OpenAI's deltas carry only what changed


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "chunkstore"
    max_model_len: int = Field(description="extension (as vLLM): the model's positions")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
