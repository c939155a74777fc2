"""The CPU priority of background threads: copies nobody waits for (backups, persists, the
store's compression and writes) yield the cores to the request path (the forward, the loads a
request waits for).

Linux gives each thread its own nice value and scheduling policy (a thread's native id works as
the pid of ``os.setpriority`` and ``os.sched_setscheduler``). A thread lowers only itself, once,
when it starts: lowering needs no privilege, raising back would. Elsewhere, or where the kernel
refuses, the thread keeps its priority and the call says so.
"""

from __future__ import annotations

import logging
import os
import threading

from chunkstore.choices import Choice

log = logging.getLogger(__name__)
LOW_NICE = 19  # the lowest nice value: a share of about 1.5% of a core against a nice-0 thread


class ThreadPriority(Choice):
    """``normal``: as the request path. ``low``: nice 19, a small share while the cores are busy.
    ``idle``: SCHED_IDLE, runs only on cycles no other thread wants."""

    NORMAL = "normal"
    LOW = "low"
    IDLE = "idle"


def lower_this_thread(priority: ThreadPriority) -> bool:
    """Give the calling thread ``priority``; returns whether it took effect (``normal`` changes
    nothing and returns True). Never raises."""
    priority = ThreadPriority.parse(priority)
    if priority is ThreadPriority.NORMAL:
        return True
    tid = threading.get_native_id()
    try:
        if priority is ThreadPriority.IDLE:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, LOW_NICE)
    except (AttributeError, OSError) as exc:  # not Linux, or refused
        log.debug("thread %s keeps its priority (%s): %s", threading.current_thread().name, priority.value, exc)
        return False
    return True


def thread_priority(native_id: int) -> tuple[str, int]:
    """(scheduling policy name, nice value) of a thread of this process, for tests and reports."""
    policy = os.sched_getscheduler(native_id)
    name = {os.SCHED_OTHER: "other", os.SCHED_IDLE: "idle", os.SCHED_BATCH: "batch"}.get(policy, str(policy))
    return name, os.getpriority(os.PRIO_PROCESS, native_id)
