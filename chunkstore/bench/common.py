"""What the benchmarks share: decimal units, reported (never asserted) targets, cold page caches,
a heap the garbage collector leaves alone while work is timed, and an orderly end on SIGTERM.

Invariants: throughputs are decimal GB/s of logical (uncompressed) bytes; a target is reported
with its measured value and verdict, and only ``--strict`` turns a miss into an exit code; a
benchmark stopped by SIGTERM or Ctrl-C stops the servers it started and deletes their folders.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
GB = 1e9
_DROP_CACHES = Path("/proc/sys/vm/drop_caches")


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float
    op: str  # ">=" or "<="
    threshold: float

    @property
    def passed(self) -> bool:
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    def to_dict(self) -> dict:
        return {"value": self.value, "target": f"{self.op} {self.threshold:g}", "pass": self.passed}


def record_targets(result: dict, targets: list[Target]) -> None:
    """Put ``targets`` into ``result`` as the JSON shows them (``targets``, ``all_pass``)."""
    result["targets"] = {t.name: t.to_dict() for t in targets}
    result["all_pass"] = all(t.passed for t in targets)


def verdict(result: dict, name: str) -> tuple[str, str]:
    """(target, 'pass' or 'FAIL') of a recorded target, for a table row."""
    t = result["targets"][name]
    return t["target"], "pass" if t["pass"] else "FAIL"


Row = tuple[str, str, str, str]  # label, value, target, verdict ("" for a figure without a target)


def table_lines(rows: list[Row], *, value_width: int = 8, target_width: int = 7) -> list[str]:
    """The rows of a benchmark's table, labels padded to the longest."""
    width = max(len(row[0]) for row in rows)
    return [f"{a:<{width}}  {b:>{value_width}}  {c:<{target_width}} {d}".rstrip() for a, b, c, d in rows]


def verdict_line(result: dict, why: str = "shared machines swing +-25%") -> str:
    """The table's last line: whether every recorded target was met."""
    return "all targets met" if result["all_pass"] else f"some targets missed ({why})"


def make_cold(paths: Iterable[Path]) -> str:
    """Evict ``paths`` (files, already fsynced) from the page cache; returns the method used:
    'drop_caches' (the whole cache, needs root), 'fadvise_dontneed' (each file), or 'none'."""
    os.sync()
    try:
        _DROP_CACHES.write_text("3\n")
        return "drop_caches"
    except OSError:
        pass
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise_dontneed"
    except (OSError, AttributeError):  # AttributeError: no posix_fadvise on this platform
        return "none"


def files_under(root: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(root) for f in files]


def run_bench(args, prog: str, configure, measure, format_table, *, failures: tuple[type[BaseException], ...],
              failed: str, finish=None) -> int:
    """What every benchmark command does around its measurement: ``configure()`` builds the
    config (ValueError: exit 2, ``prog: error: ...``), ``--output`` is checked before any work,
    ``measure(cfg)`` runs it (one of ``failures``: exit 1, ``prog: <failed>: ...``), then the table
    or the JSON is printed and written, and ``finish(result)`` (when given) does what the command
    does after it, its non-zero exit code the command's; exit 1 for a missed target under
    ``--strict``, else 0."""
    from chunkstore.output import check_output_path, emit_result

    try:
        cfg = configure()
        check_output_path(args)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        with exit_on_sigterm():
            result = measure(cfg)
    except failures as exc:
        print(f"{prog}: {failed}: {exc}", file=sys.stderr)
        return 1
    emit_result(args, result, format_table(result))
    if finish is not None and (code := finish(result)):
        return code
    return 1 if args.strict and not result["all_pass"] else 0


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """In the block, SIGTERM raises SystemExit(143) in the main thread, as Ctrl-C raises
    KeyboardInterrupt: the ``with`` blocks unwind, so the servers a benchmark started (PostgreSQL,
    radosgw, simulated servers) are stopped by their PIDs and their folders deleted. Python's
    default ends the process where it stands and leaves them running, with gigabytes in /tmp.
    Elsewhere than the main thread the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Run the block with the objects alive now (torch's, the benchmark's pages and keys) out of
    the cyclic garbage collector's reach, as a server's heap is once it has started
    (``chunkstore serve`` freezes it too). Else a full collection, which visits every tracked
    object (about 230,000 in ``bench store``: 66 ms of CPU here), lands in whichever timed step
    happens to trigger it, and swings that step's CPU per GB by more than the cipher costs."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
