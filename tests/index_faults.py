"""A chunk index that fails its writes on cue, as SQLite fails them on a full disk: the seam is
ChunkStore's ``index_factory`` (the real ChunkIndex, with its insert and delete refused while the
test's IndexFaults say so), so no test reaches into a store to replace its index's methods."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy.exc

from chunkstore.disk.index import ChunkIndex


def disk_full_error(statement: str) -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError(statement, {}, sqlite3.OperationalError("database or disk is full"))


@dataclass(slots=True)
class IndexFaults:
    """Which index writes fail now (the test flips them)."""

    insert: bool = False
    delete: bool = False


class FaultyIndex(ChunkIndex):
    def __init__(self, root, faults: IndexFaults, **kwargs) -> None:
        super().__init__(root, **kwargs)
        self.faults = faults

    def insert(self, rows):
        if self.faults.insert:
            raise disk_full_error("INSERT INTO chunks")
        return super().insert(rows)

    def delete(self, keys):
        if self.faults.delete:
            raise disk_full_error("DELETE FROM chunks")
        return super().delete(keys)


def faulty_index(faults: IndexFaults) -> Callable[..., ChunkIndex]:
    """An ``index_factory`` for ChunkStore whose index fails as ``faults`` say."""
    return functools.partial(FaultyIndex, faults=faults)
