"""The rules both APIs read JSON bodies by (chunkstore.http.json_body, json_types, errors): what a
body must be before a route sees it, JSON Schema's types read strictly, the namespace rule as the
spec states it, and which field an error names."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.datastructures import Headers

from chunkstore.api.schemas.config import min_disk_size_gb
from chunkstore.disk.namespaces import check_namespace
from chunkstore.http.errors import HttpError, error_field, main_error
from chunkstore.http.json_body import MAX_DEPTH, check_encoding, check_json, is_json
from chunkstore.http.json_types import NAMESPACE_OR_EMPTY_PATTERN, NAMESPACE_PATTERN, JsonFloat, json_int


def _code(body: bytes) -> str | None:
    try:
        check_json(body)
    except HttpError as exc:
        assert exc.status == 400
        return exc.code
    return None


@pytest.mark.parametrize("body,code", [
    (b"", None), (b'{"a": [1, {"b": null}]}', None), (b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, None),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "too_deep"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "too_deep"),  # deeper than Python's parser goes
    (b"\xff", "invalid_encoding"), (b'"\xc3"', "invalid_encoding"), (b"\x00", "invalid_json"),
    (b"{", "invalid_json"), (b"\xef\xbb\xbf{}", "invalid_json"),  # a BOM is not JSON text
])
def test_check_json(body, code):
    assert _code(body) == code


def test_only_identity_is_an_encoding_a_body_may_have():
    check_encoding(Headers({"content-encoding": "identity"}))
    check_encoding(Headers({}))
    for coding in ("gzip", "identity, gzip", "x-custom"):
        with pytest.raises(HttpError) as raised:
            check_encoding(Headers({"content-encoding": coding}))
        assert raised.value.status == 415 and raised.value.code == "unsupported_encoding"


def test_json_content_types_are_fastapis():
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8") and is_json("application/x+json")
    assert not is_json(None) and not is_json("text/plain") and not is_json("application/x-www-form-urlencoded")


class Numbers(BaseModel):
    model_config = ConfigDict(strict=True)

    count: json_int(ge=0, le=10) = 0
    ratio: JsonFloat = 0.0


@pytest.mark.parametrize("body,fields", [
    ({"count": 5}, {"count": 5}), ({"count": 5.0}, {"count": 5}), ({"ratio": 1}, {"ratio": 1.0}),
    ({"count": True}, None), ({"count": "5"}, None), ({"count": 5.5}, None), ({"count": 11}, None),
    ({"ratio": False}, None), ({"ratio": "0.5"}, None),
])
def test_json_numbers_are_json_schemas(body, fields):
    if fields is None:
        with pytest.raises(ValidationError):
            Numbers.model_validate(body)
    else:
        assert Numbers.model_validate(body).model_dump(include=set(fields)) == fields


def test_bounds_are_in_the_spec_as_minimum_and_maximum():
    assert Numbers.model_json_schema()["properties"]["count"] == {
        "type": "integer", "minimum": 0, "maximum": 10, "default": 0, "title": "Count"}


def _is_namespace(value: str) -> bool:
    try:
        check_namespace(value)
    except ValueError:
        return False
    return True


def _spec_allows(value: str, pattern: str = NAMESPACE_PATTERN) -> bool:
    # JSON Schema's pattern is ECMA 262's: `$` is the end of the text (Python's \Z), and maxLength is 256
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None and len(value) <= 256


EDGES = ["", ".", "..", "...", ".a", "a.", "a", "a/b", "/", "x" * 256, "x" * 257, "\x00", "a\n", "\x7f", "\x85",
         "\x9f", "\xa0", "é", "日本", "\U0001f600", " "]


@pytest.mark.parametrize("value", EDGES)
def test_the_specs_namespace_pattern_is_the_namespace_rule(value):
    assert _spec_allows(value) == _is_namespace(value), value
    assert _spec_allows(value, NAMESPACE_OR_EMPTY_PATTERN) == (value == "" or _is_namespace(value)), value


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from("./\x00\x85"),
               max_size=260))
def test_the_specs_namespace_pattern_is_the_namespace_rule_for_any_text(value):
    assert _spec_allows(value) == _is_namespace(value)


@pytest.mark.parametrize("loc,field", [
    (("body", "messages", 0, "content"), "messages.0.content"),
    (("body", "prompt", "constrained-str"), "prompt"),
    (("body", "sampling_params", "GenerateSamplingParams", "temperature"), "sampling_params.temperature"),
    (("body", "prompt", "list[constrained-int]", 1), "prompt.1"),
    (("query", "limit"), "limit"), (("body",), None), ((), None),
])
def test_an_error_names_the_field_not_the_union_branch(loc, field):
    assert error_field(loc) == field


def test_the_main_error_is_the_one_that_got_deepest():
    errors = [{"loc": ("body", "prompt", "str"), "msg": "not text"},
              {"loc": ("body", "prompt", "list[int]", 1), "msg": "below 0"},
              {"loc": ("body", "prompt", "list[str]", 0), "msg": "not text"}]
    assert main_error(errors)["msg"] == "below 0"
    assert main_error([])["msg"] == "invalid request"


@pytest.mark.parametrize("page_size_bytes", [1, 15, 63, 1024, 32768, 3 * 10**9 + 7])
def test_the_least_disk_size_holds_a_page_and_nothing_less_does(page_size_bytes):
    least = min_disk_size_gb(page_size_bytes)
    assert int(least * 10**9) >= page_size_bytes
    assert int(math.nextafter(least, 0) * 10**9) < page_size_bytes

