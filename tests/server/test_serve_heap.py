"""``chunkstore serve`` keeps its start-up heap out of the garbage collector's passes."""

from __future__ import annotations

import gc
import weakref

from chunkstore.serve import freeze_startup_heap


class _Node:
    pass


def test_the_startup_heap_is_frozen_and_what_comes_later_is_still_collected():
    try:
        before = _Node()
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # frozen: no pass visits it
        later = _Node()
        later.self = later  # a cycle: only the collector frees it
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
