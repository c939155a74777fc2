"""What every request body of the generation APIs shares: strict JSON types, text that encodes,
bounded stop lists, prompts, fields accepted only at their neutral value.

Invariants: the OpenAPI spec and the server agree in both directions: a body the spec calls valid
is served (or refused for what only the running server knows: a model's name, a full queue, a
prompt longer than the model, a token id outside its vocabulary, which the server's spec adds at
start), and a body the spec forbids is refused with 400 naming its field. So: numbers, integers and
flags are JSON's (chunkstore.http.json_types: never ``true`` for 1 nor ``"5"`` for 5); a prompt is
never empty (the engine has nothing to continue); a field the engine cannot honour is in the spec
with its neutral values only (``neutral_fields``); stop lists are the engine's bounded ones
(``MAX_STOP_STRINGS`` strings of 1-``MAX_STOP_CHARS`` characters), checked where the body is parsed,
so nothing unbounded reaches the engine's thread. Every string, wherever it sits (a field, a list,
a nested object, a dict's keys), encodes as UTF-8, because JSON's ``"\\ud800"`` escapes decode to
lone surrogates that break every later ``.encode()`` (a cache key, a log line, a response, a stream
already answered 200); a failing string is refused with 400 naming its field (the one rule JSON
Schema cannot state; generated text never holds a lone surrogate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from chunkstore.disk.namespaces import MAX_NAMESPACE_CHARS, check_namespace
from chunkstore.engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS, check_stop_strings
from chunkstore.http.json_types import NAMESPACE_OR_EMPTY_PATTERN, json_int

NOT_TEXT = "must be valid Unicode text (it holds a lone UTF-16 surrogate such as \\ud800)"
TOKEN_IDS = "x-chunkstore-token-ids"  # marks the token id lists in the spec (chunkstore.server.spec bounds them)


def is_encodable(value: Any) -> bool:
    """Whether every string in ``value`` (nested in lists, tuples and dict keys and values)
    encodes as UTF-8; other values count as encodable (models check their own fields)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, (list, tuple)):
        return all(is_encodable(item) for item in value)
    if isinstance(value, dict):
        return all(is_encodable(k) and is_encodable(v) for k, v in value.items())
    return True


class RequestBody(BaseModel):
    """Base of every request model (nested ones too): JSON's types strictly (``strict``: a string
    field takes a string, a flag a boolean), unknown fields ignored, as OpenAI-compatible servers
    do, and every field's strings valid Unicode text."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _encodable_extras(cls, data: Any) -> Any:
        """Fields the model ignores hold valid text too (the model's own are checked by name)."""
        if isinstance(data, dict):
            for key, value in data.items():
                if key not in cls.model_fields and not is_encodable({key: value}):
                    raise ValueError(NOT_TEXT)
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _encodable_text(cls, value: Any, info: ValidationInfo) -> Any:
        if not is_encodable(value):
            raise ValueError(NOT_TEXT)
        return value


def _same_json(value: Any, neutral: Any) -> bool:
    """Whether ``value`` is ``neutral`` as JSON Schema compares them: 0 is 0.0, false is not 0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return isinstance(value, bool) and isinstance(neutral, bool) and value == neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


# field name -> (its neutral values, why anything else is refused)
NeutralTable = Mapping[str, tuple[tuple[Any, ...], str]]


def neutral_value(table: NeutralTable, name: str, value: Any) -> Any:
    """``value`` as the neutral value it equals; raises ValueError (``table``'s reason) for any other."""
    allowed, message = table[name]
    for neutral in allowed:
        if _same_json(value, neutral):
            return neutral
    raise ValueError(message)


def neutral_fields(table: NeutralTable) -> Callable[[dict[str, Any], type], None]:
    """A model's ``json_schema_extra``: each of its fields in ``table`` takes its neutral values
    only (an ``enum`` beside the field's type), as ``neutral_value`` checks."""
    def extra(schema: dict[str, Any], model: type) -> None:
        for name, prop in schema.get("properties", {}).items():
            if name in table:
                prop["enum"] = list(table[name][0])
                prop["description"] = f"accepted only at its neutral value: {table[name][1]}"
    return extra


def _namespace_or_empty(value: Any) -> Any:
    """The namespace rule's message for a string that breaks it (an empty one means "not given")."""
    return check_namespace(value) if isinstance(value, str) and value else value


# A namespace as the `user` field or the X-Chunkstore-Namespace header gives it.
NamespaceText = Annotated[str, Field(max_length=MAX_NAMESPACE_CHARS, pattern=NAMESPACE_OR_EMPTY_PATTERN),
                          BeforeValidator(_namespace_or_empty)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None
PromptText = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[json_int(ge=0)], Field(min_length=1, json_schema_extra={TOKEN_IDS: True})]


def one_of_batch(item: Any) -> Any:
    """A list holding exactly one ``item``: what a batch of one is, in the spec."""
    return Annotated[list[item], Field(min_length=1, max_length=1)]


def single(value: Any, name: str) -> Any:
    """A batch of one (a list of one string or list) as that one; raises ValueError for larger
    batches. Use as a before-validator."""
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        if len(value) != 1:
            raise ValueError(f"batches are not supported: send one {name} per request")
        return value[0]
    return value


def one_prompt(value: Any, name: str) -> Any:
    """``single``, then ValueError for an empty prompt (text or token ids): there is nothing to
    continue. Use as a before-validator."""
    value = single(value, name)
    if value == "" or value == []:
        raise ValueError("the prompt is empty")
    return value


def stop_list(value: Any) -> Any:
    """A ``stop`` field's value as a list of strings (one string, or none, is a list too);
    raises ValueError for an empty string, beyond the engine's bounds, or a string that is not
    valid text. Use as a before-validator."""
    stops = [value] if isinstance(value, str) else [] if value is None else value
    if isinstance(stops, list) and all(isinstance(s, str) for s in stops):
        check_stop_strings(stops)
        if not is_encodable(stops):
            raise ValueError(NOT_TEXT)
    return stops
