"""What every request body of the generation APIs shares: text that encodes, bounded stop lists, a prompt.

Invariants: a body that validates holds only strings that encode as UTF-8, wherever they sit
(a field, a list, a nested object, a dict's keys), because JSON's ``"\\ud800"`` escapes decode to
lone surrogates that break every later ``.encode()`` (a cache key, a log line, a response, a
stream already answered 200); a failing string is refused with 400 naming its field; stop lists
are the engine's bounded ones (``MAX_STOP_STRINGS`` strings of 1-``MAX_STOP_CHARS`` characters),
checked where the body is parsed, so nothing unbounded reaches the engine's thread.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from chunkstore.engine.sampling import check_stop_strings


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
    """Base of every request model (nested ones too): unknown fields are ignored, as
    OpenAI-compatible servers do, and every field's strings must be valid Unicode text."""

    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="after")
    @classmethod
    def _encodable_text(cls, value: Any, info: ValidationInfo) -> Any:
        if not is_encodable(value):
            raise ValueError("must be valid Unicode text (it holds a lone UTF-16 surrogate such as \\ud800)")
        return value


def stop_list(value: Any) -> Any:
    """A ``stop`` field's value as a list of strings (one string, or none, is a list too);
    raises ValueError for an empty string or beyond the engine's bounds. Use as a before-validator."""
    stops = [value] if isinstance(value, str) else [] if value is None else value
    if isinstance(stops, list) and all(isinstance(s, str) for s in stops):
        check_stop_strings(stops)
    return stops


def non_empty_prompt(value: Any) -> Any:
    """Raises ValueError for an empty prompt (text or token ids): there is nothing to continue."""
    if value is not None and len(value) == 0:
        raise ValueError("the prompt is empty")
    return value
