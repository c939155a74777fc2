"""schemathesis hooks for tests/server/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

Generated requests keep their shape, but a generation asks for at most a few tokens (the cases are
about validation and answers, not long decodes on two CPU cores): a token budget above
``MAX_CASE_TOKENS`` (an integer, or a number such as ``1e3`` that JSON Schema calls one), or none
where the default runs to the model's last position (chat), becomes ``MAX_CASE_TOKENS``; invalid
values (negative, fractions, booleans, strings) are left for the server to refuse.
"""

from __future__ import annotations

import schemathesis

MAX_CASE_TOKENS = 4


def _bounded(body: dict, field: str) -> None:
    value = body.get(field)
    is_whole = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if value is None or is_whole and value > MAX_CASE_TOKENS:
        body[field] = MAX_CASE_TOKENS


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path in ("/v1/completions", "/v1/chat/completions"):
        _bounded(body, "max_tokens")
        if "max_completion_tokens" in body:
            _bounded(body, "max_completion_tokens")
    elif case.path == "/generate":
        params = body.get("sampling_params")
        if isinstance(params, list) and len(params) == 1:  # a batch of one
            params = params[0]
        if isinstance(params, dict):
            _bounded(params, "max_new_tokens")
        elif params is None:  # not given, or null: SGLang's default budget
            body["sampling_params"] = {"max_new_tokens": MAX_CASE_TOKENS}
