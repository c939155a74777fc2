"""Run another module's tests again on other fixtures: ``recollect(module, into=globals())`` copies
its tests (all, or those named, less those left out; never those marked slow) and everything else it defines or imports
(its fixtures among them) into the calling test module, where a fixture of the caller's own, such
as ``postgres_url``, then stands in for the one they were written against."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType


def is_slow(test: object) -> bool:
    return any(mark.name == "slow" for mark in getattr(test, "pytestmark", []))


def recollect(module: ModuleType, into: dict, tests: Iterable[str] | None = None,
              leave_out: Iterable[str] = ()) -> list[str]:
    """Copy ``module``'s tests (those in ``tests``, or all but those in ``leave_out``) that are not
    marked slow, and its other names that ``into`` lacks; returns the tests copied. Raises KeyError
    for a name in ``tests`` or ``leave_out`` that is not one of the module's tests (a test renamed
    there must be renamed here)."""
    wanted = None if tests is None else set(tests)
    unwanted = set(leave_out)
    found = {name for name in vars(module) if name.startswith("test_")}
    if missing := ((wanted or set()) | unwanted) - found:
        raise KeyError(f"{module.__name__} has no tests {sorted(missing)}")
    copied = []
    for name, obj in vars(module).items():
        if name.startswith("test_"):
            if (wanted is None or name in wanted) and name not in unwanted and not is_slow(obj):
                into[name] = obj
                copied.append(name)
        elif not name.startswith("__") and name not in into:
            into[name] = obj
    return copied
