"""A batch of tasks on a thread pool, one future per task, but a few submissions for the whole
batch: ``lanes`` runners, each taking the next task until none is left.

Why: a pool wakes a thread for every ``submit``. A put of 128 pages submitted page by page woke
threads 128 times, and each wake-up made the submitting thread hand the GIL over mid-loop; with
as many runners as threads, each thread is woken once per batch and stays busy until it is done.

Invariants: each task runs at most once, on one runner, and its future holds its result or its
exception; a future cancelled before its task starts is skipped (``Future.cancel`` works as for
``submit``); tasks start in order.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any


def submit_all(pool: Executor, lanes: int, fn: Callable[..., Any], args: Sequence[tuple]) -> list[Future]:
    """``fn(*a)`` for each ``a`` of ``args`` on ``pool``, on at most ``lanes`` of its threads;
    returns a future per call, in order."""
    futures = [Future() for _ in args]
    if not futures:
        return futures
    jobs = iter(zip(futures, args))
    lock = threading.Lock()

    def runner() -> None:
        while True:
            with lock:  # (a bare next() on a shared iterator is not atomic across threads)
                job = next(jobs, None)
            if job is None:
                return
            future, a = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*a)
            except BaseException as exc:  # the task's error is its future's, as with submit
                future.set_exception(exc)
            else:
                future.set_result(result)

    for _ in itertools.islice(futures, max(1, lanes)):
        pool.submit(runner)
    return futures
