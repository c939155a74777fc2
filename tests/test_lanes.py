"""lanes.submit_all: a batch of tasks on a thread pool with a future each, run by at most
``lanes`` of its threads; results and errors per task, a cancelled task skipped."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from chunkstore.disk.lanes import submit_all


def test_each_task_runs_once_and_its_future_holds_its_result_in_order():
    ran: list[int] = []
    lock = threading.Lock()

    def square(x: int) -> int:
        with lock:
            ran.append(x)
        return x * x

    with ThreadPoolExecutor(8) as pool:
        futures = submit_all(pool, 4, square, [(i,) for i in range(100)])
        assert [f.result(10) for f in futures] == [i * i for i in range(100)]
    assert sorted(ran) == list(range(100))


def test_a_failing_task_fails_only_its_own_future():
    def task(x: int) -> int:
        if x % 3 == 0:
            raise OSError(f"task {x}")
        return x

    with ThreadPoolExecutor(4) as pool:
        futures = submit_all(pool, 4, task, [(i,) for i in range(10)])
        for i, f in enumerate(futures):
            if i % 3 == 0:
                with pytest.raises(OSError, match=f"task {i}"):
                    f.result(10)
            else:
                assert f.result(10) == i


def test_the_batch_runs_on_at_most_lanes_threads():
    names: set[str] = set()
    lock = threading.Lock()

    def task() -> None:
        with lock:
            names.add(threading.current_thread().name)

    with ThreadPoolExecutor(16) as pool:
        for f in submit_all(pool, 2, task, [()] * 200):
            f.result(10)
    assert 1 <= len(names) <= 2


def test_a_task_cancelled_before_it_starts_is_skipped_and_the_rest_run():
    started = threading.Event()
    release = threading.Event()
    ran: list[int] = []

    def task(x: int) -> int:
        if x == 0:
            started.set()
            release.wait(10)
        ran.append(x)
        return x

    with ThreadPoolExecutor(1) as pool:
        futures = submit_all(pool, 1, task, [(i,) for i in range(5)])
        assert started.wait(10)
        assert futures[2].cancel() and not futures[0].cancel()  # a running task cannot be cancelled
        release.set()
        assert [futures[i].result(10) for i in (0, 1, 3, 4)] == [0, 1, 3, 4]
    assert futures[2].cancelled() and ran == [0, 1, 3, 4]


def test_no_tasks_submit_nothing():
    with ThreadPoolExecutor(2) as pool:
        assert submit_all(pool, 2, print, []) == []
