"""SGLang's native API bodies: /generate (``text`` or ``input_ids``, ``sampling_params``, ``stream``), model info.

Invariants: the names are SGLang's (``max_new_tokens``, ``sampling_seed``, ``meta_info``, a
``finish_reason`` object with a ``type``), so tools written for SGLang servers run unchanged;
parameters the engine cannot honour are refused (400 naming them) unless neutral, and the spec
lists their neutral values only; exactly one of ``text`` and ``input_ids`` (the spec says so too);
unknown fields are ignored; ``meta_info.cached_tokens_details`` (device, host, disk) sums to
``cached_tokens``; request models are ``RequestBody``s (request_fields.py: JSON's types strictly,
strings that encode, bounded stop lists, prompts never empty) and ``rid``, echoed in every event
of a stream, is at most ``MAX_RID_CHARS`` characters.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from chunkstore.engine import FinishReason, GenerationResult, SamplingParams
from chunkstore.engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_TEMPERATURE
from chunkstore.http.json_types import JsonBool, JsonFloat, JsonInt, json_int
from chunkstore.server.openai_schemas import SEED_MODULUS, CachedTokensDetails
from chunkstore.server.request_fields import (PromptText, RequestBody, Stop, TokenIds, neutral_fields, neutral_value,
                                              one_of_batch, one_prompt, stop_list)

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
MAX_RID_CHARS = 256  # a rid is echoed in every event of a stream

_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "only n=1 is supported"),
    "top_k": ((-1, 0), "top_k is not supported (send -1)"),
    "min_p": ((0,), "min_p is not supported (send 0)"),
    "min_new_tokens": ((0,), "min_new_tokens is not supported"),
    "frequency_penalty": ((0,), "frequency_penalty is not supported (send 0)"),
    "presence_penalty": ((0,), "presence_penalty is not supported (send 0)"),
    "repetition_penalty": ((1,), "repetition_penalty is not supported (send 1)"),
    "stop_token_ids": ((None, []), "stop_token_ids are not supported (use stop strings)"),
    "json_schema": ((None,), "constrained decoding (json_schema) is not supported"),
    "regex": ((None,), "constrained decoding (regex) is not supported"),
    "ebnf": ((None,), "constrained decoding (ebnf) is not supported"),
    "no_stop_trim": ((False,), "no_stop_trim is not supported"),
    "return_logprob": ((None, False), "logprobs are not supported"),
    "image_data": ((None, [], ""), "image inputs are not supported"),
    "lora_path": ((None, ""), "LoRA adapters are not supported"),
}

_NOT_NULL = {"not": {"type": "null"}}


def _one_prompt_schema(schema: dict[str, Any], model: type) -> None:
    """The spec of GenerateRequest: exactly one of ``text`` and ``input_ids`` is given (not null)."""
    neutral_fields(_NEUTRAL)(schema, model)
    schema["oneOf"] = [{"required": [name], "properties": {name: _NOT_NULL}} for name in ("text", "input_ids")]


class GenerateSamplingParams(RequestBody):
    """SGLang's ``sampling_params``."""

    model_config = ConfigDict(populate_by_name=True, json_schema_extra=neutral_fields(_NEUTRAL))

    max_new_tokens: json_int(ge=0) = Field(
        SGLANG_DEFAULT_MAX_NEW_TOKENS, description="capped to what the model's positions leave after the prompt")
    temperature: Annotated[JsonFloat, Field(ge=0, le=MAX_TEMPERATURE)] = Field(
        1.0, description="below 1e-5 (0 included) = greedy")
    top_p: Annotated[JsonFloat, Field(gt=0, le=1)] = 1.0
    stop: Stop = Field([], description=f"at most {MAX_STOP_STRINGS} strings, each 1-{MAX_STOP_CHARS} characters")
    ignore_eos: JsonBool = False
    sampling_seed: json_int(ge=0) | None = Field(
        None, validation_alias=AliasChoices("sampling_seed", "seed"),
        description="makes sampling reproducible (taken modulo 2^63); `seed` is taken too")
    n: JsonInt = 1
    top_k: JsonInt = -1
    min_p: JsonFloat = 0.0
    min_new_tokens: JsonInt = 0
    frequency_penalty: JsonFloat = 0.0
    presence_penalty: JsonFloat = 0.0
    repetition_penalty: JsonFloat = 1.0
    stop_token_ids: list[JsonInt] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    no_stop_trim: JsonBool = False

    @field_validator("n", "top_k", "min_p", "min_new_tokens", "frequency_penalty", "presence_penalty",
                     "repetition_penalty", "stop_token_ids", "json_schema", "regex", "ebnf", "no_stop_trim",
                     mode="before")
    @classmethod
    def _neutral_only(cls, value: Any, info: ValidationInfo) -> Any:
        return neutral_value(_NEUTRAL, info.field_name, value)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> Any:
        return stop_list(value)

    def engine_params(self) -> SamplingParams:
        """Raises ValueError for what the engine refuses (e.g. temperature above 100)."""
        seed = None if self.sampling_seed is None else self.sampling_seed % SEED_MODULUS
        return SamplingParams(max_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              stop=tuple(self.stop or ()), seed=seed, ignore_eos=self.ignore_eos)


class GenerateRequest(RequestBody):
    """POST /generate: exactly one of ``text`` and ``input_ids``."""

    model_config = ConfigDict(json_schema_extra=_one_prompt_schema)

    text: PromptText | one_of_batch(PromptText) | None = Field(None, description="a batch of one is taken as that one")
    input_ids: TokenIds | one_of_batch(TokenIds) | None = Field(None, description="a batch of one is taken as that one")
    sampling_params: GenerateSamplingParams | one_of_batch(GenerateSamplingParams) | None = Field(
        default_factory=GenerateSamplingParams, description="a batch of one is taken as that one; null: the defaults")
    stream: JsonBool = False
    rid: str | None = Field(None, max_length=MAX_RID_CHARS,
                            description="request id echoed as meta_info.id (default: a fresh one)")
    return_logprob: JsonBool | None = None
    image_data: Any = None
    lora_path: Any = None

    @field_validator("return_logprob", "image_data", "lora_path", mode="before")
    @classmethod
    def _neutral_only(cls, value: Any, info: ValidationInfo) -> Any:
        return neutral_value(_NEUTRAL, info.field_name, value)

    @field_validator("text", mode="before")
    @classmethod
    def _one_text(cls, value: Any) -> Any:
        return one_prompt(value, "text")

    @field_validator("input_ids", mode="before")
    @classmethod
    def _one_input(cls, value: Any) -> Any:
        return one_prompt(value, "input_ids list")

    @field_validator("sampling_params", mode="before")
    @classmethod
    def _one_params(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, list):
            return value
        if len(value) != 1 or not isinstance(value[0], dict):
            raise ValueError("batches are not supported: send one sampling_params object per request")
        return value[0]

    @model_validator(mode="after")
    def _one_prompt(self) -> "GenerateRequest":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        return self


# ---- responses ------------------------------------------------------------------------------------

class FinishReasonInfo(BaseModel):
    """SGLang's finish reason: ``{"type": "length", "length": N}``, ``{"type": "stop", "matched": id}``
    (the end token; None for a stop string) or ``{"type": "abort", "message": ...}``."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    @classmethod
    def of(cls, result: GenerationResult, eos_token_ids: frozenset[int]) -> "FinishReasonInfo":
        if result.finish_reason is FinishReason.LENGTH:
            return cls(type="length", length=result.completion_tokens)
        if result.finish_reason is FinishReason.ABORT:
            return cls(type="abort", message="aborted (cancelled, or the server shut down)")
        last = result.token_ids[-1] if result.token_ids else None
        return cls(type="stop", matched=last if last in eos_token_ids else None)

    def dump(self) -> dict:
        """Only the field of its type, as SGLang sends it."""
        detail = {"stop": "matched", "length": "length", "abort": "message"}[self.type]
        return {"type": self.type, detail: getattr(self, detail)}


class MetaInfo(BaseModel):
    id: str
    finish_reason: FinishReasonInfo | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    cached_tokens_details: CachedTokensDetails | None = None
    e2e_latency: float | None = None

    @classmethod
    def of(cls, rid: str, result: GenerationResult, eos_token_ids: frozenset[int]) -> "MetaInfo":
        return cls(id=rid, finish_reason=FinishReasonInfo.of(result, eos_token_ids),
                   prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                   cached_tokens=result.cached_tokens,
                   cached_tokens_details=CachedTokensDetails(device=result.device_tokens, host=result.host_tokens,
                                                             disk=result.disk_tokens),
                   e2e_latency=result.latency_s)

    def dump(self) -> dict:
        """JSON of the meta info: ``finish_reason`` always (null until the end), the rest when known."""
        out = self.model_dump(exclude_none=True, exclude={"finish_reason"})
        out["finish_reason"] = None if self.finish_reason is None else self.finish_reason.dump()
        return out


class GenerateResponse(BaseModel):
    """/generate's answer (and, streamed, each event: ``text`` so far, ``output_ids`` in the last)."""

    text: str
    output_ids: list[int] | None = None
    meta_info: MetaInfo

    def dump(self) -> dict:
        out = {"text": self.text, "meta_info": self.meta_info.dump()}
        if self.output_ids is not None:
            out["output_ids"] = self.output_ids
        return out


class ModelInfo(BaseModel):
    """GET /get_model_info: SGLang's fields, then this server's."""

    model_path: str
    tokenizer_path: str
    is_generation: bool = True
    preferred_sampling_params: None = None
    weight_version: str = "default"
    served_model_name: str
    model_id: str = Field(description="the cache keys' model id (names the weights)")
    max_positions: int
    page_size: int
