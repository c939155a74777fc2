"""schemathesis hooks for tests/server/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

Generated requests keep their shape, but a generation asks for at most a few tokens (the cases are
about validation and answers, not long decodes on two CPU cores): a valid token budget above
``MAX_CASE_TOKENS``, or none where the default runs to the model's last position (chat), becomes
``MAX_CASE_TOKENS``; invalid values (negative, not integers) are left for the server to refuse.
"""

from __future__ import annotations

import schemathesis

MAX_CASE_TOKENS = 4


def _bounded(body: dict, field: str) -> None:
    value = body.get(field)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > MAX_CASE_TOKENS):
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
    elif case.path == "/generate" and isinstance(body.get("sampling_params"), dict):
        _bounded(body["sampling_params"], "max_new_tokens")
    elif case.path == "/generate" and "sampling_params" not in body:
        body["sampling_params"] = {"max_new_tokens": MAX_CASE_TOKENS}
