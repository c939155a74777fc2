"""schemathesis hooks for the management API's spec (loaded through SCHEMATHESIS_HOOKS).

A listing's ``cursor`` is opaque: only a ``next_cursor`` the API answered is one (the stateful
phase follows those links), so a valid request never makes one up: a generated cursor is dropped
from the valid (positive) cases. Invalid (negative) cases keep theirs, for the API to refuse.
"""

from __future__ import annotations

import schemathesis


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    query = case.query
    if not isinstance(query, dict) or "cursor" not in query or case.meta is None:
        return
    if case.meta.generation.mode.is_positive:
        del query["cursor"]
