"""The read-only guard: one decorator that every mutating method of ChunkStore wears.

Invariant: a method marked ``mutation`` refuses a read-only store with ReadOnlyStoreError before
anything runs (tests/test_store_read_only.py checks that every public method is either marked or
listed as reading).
"""

from __future__ import annotations

import functools

from chunkstore.disk.results import ReadOnlyStoreError


def mutation(method):
    """Refuse ``method`` on a read-only store (ReadOnlyStoreError, before anything runs): the one
    read-only check of every mutating method (MUTATING_METHODS)."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if self.read_only:
            raise ReadOnlyStoreError(f"{method.__name__}: the store at {self.root} is opened read-only")
        return method(self, *args, **kwargs)

    guarded.is_mutation = True
    return guarded
