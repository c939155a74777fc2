"""Crash soak: a writer process SIGKILLed at random points, and the checks run after each kill.

Invariants checked after every kill, on a fresh open of the store: no temp file survives the open;
every page the writer could have written loads bit-identical or is a miss (never other bytes);
``exists`` agrees with ``get``; no file is corrupt (a kill never leaves a half-written chunk); the
pages of the last step the writer reported as committed are still stored; per-namespace usage
matches the rows. The writer is deterministic per seed, so the parent recomputes what it wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import itertools
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from chunkstore.disk.files import Durability
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import PageRef, chain_pages
from chunkstore.disk.store import ChunkStore, read_identity
from chunkstore.output import add_json_flag
from chunkstore.testing.tensors import same_bytes

SOAK_IDENTITY = ModelIdentity("soak", "bfloat16", 2, 2, 16, 4)
NAMESPACES = ("default", "ns1")
BRANCHING = 3  # each page of a chain is one of 3 token blocks, so chains share prefixes
MAX_DEPTH = 5  # pages per chain: 2 namespaces x (3 + 9 + 27 + 81 + 243) = 726 possible pages
DEFAULT_CAPACITY_BYTES = 48 << 10  # about 55 chunks of ~900 bytes: puts evict all the time
DEFAULT_MAX_DELAY_S = 0.3
READY_LINE = "ready"
_STARTUP_TIMEOUT_S = 120.0

Progress = Callable[[int], None]  # called with the number of cycles just done


class StepOp(enum.Enum):
    PUT = "put"
    GET = "get"
    EVICT = "evict"
    DELETE_NAMESPACE = "delete_namespace"


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    op: StepOp
    namespace: str | None  # None for EVICT, which evicts across namespaces
    digits: tuple[int, ...] = ()  # the chain, for PUT and GET
    evict_bytes: int = 0


# -- what the writer writes (shared by writer and checker) ---------------------------------

def page_tokens(level: int, digit: int) -> list[int]:
    base = (level * BRANCHING + digit) * 1000
    return [base + t for t in range(SOAK_IDENTITY.page_size)]


def chain_for(namespace: str, digits: tuple[int, ...]) -> list[PageRef]:
    tokens = [t for level, d in enumerate(digits) for t in page_tokens(level, d)]
    return chain_pages(SOAK_IDENTITY, tokens, namespace)


def all_pages() -> list[PageRef]:
    """Every page the writer can ever write, each once."""
    seen: dict[bytes, PageRef] = {}
    for ns in NAMESPACES:
        for digits in itertools.product(range(BRANCHING), repeat=MAX_DEPTH):
            for p in chain_for(ns, digits):
                seen.setdefault(p.key, p)
    return list(seen.values())


def expected_page(key: bytes) -> torch.Tensor:
    """The KV the writer stores under ``key``: a function of the key bytes alone."""
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))
    return (torch.randn(SOAK_IDENTITY.page_shape, generator=g) * 0.5).to(torch.bfloat16)


def plan(seed: int) -> Iterator[Step]:
    """The writer's steps for ``seed``, forever; a pure function of the seed (never of results),
    so the checker can replay it."""
    rng = random.Random(seed)
    for i in itertools.count():
        r = rng.random()
        if r < 0.02:
            yield Step(i, StepOp.DELETE_NAMESPACE, NAMESPACES[1])
        elif r < 0.07:
            yield Step(i, StepOp.EVICT, None, evict_bytes=rng.randint(1, 8 << 10))
        else:
            op = StepOp.GET if r < 0.20 else StepOp.PUT
            ns = NAMESPACES[0] if rng.random() < 0.7 else NAMESPACES[1]
            depth = rng.randint(1, MAX_DEPTH)
            yield Step(i, op, ns, tuple(rng.randrange(BRANCHING) for _ in range(depth)))


# -- the writer (child process) -------------------------------------------------------------

def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # one write per line: the parent parses what got out before the kill


def run_writer(disk_path: str | os.PathLike, seed: int, *, capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
               durability: Durability = Durability.NONE, max_steps: int | None = None) -> int:
    """Write the steps of ``plan(seed)`` to the store at ``disk_path``, printing one JSON line per
    committed step, until killed (or ``max_steps``). Returns 3 if a read returned wrong bytes."""
    _say(READY_LINE)
    with ChunkStore(disk_path, SOAK_IDENTITY, capacity_bytes=capacity_bytes, durability=durability,
                    num_workers=2) as store:
        _say("open")
        return run_steps(store, seed, max_steps=max_steps, say=_say)


def run_steps(store: ChunkStore, seed: int, *, max_steps: int | None = None,
              say: Callable[[str], None] = _say) -> int:
    """The writer's loop on an open ``store``: the steps of ``plan(seed)``, ``say``-ing one JSON
    line per committed step, until killed (or ``max_steps``). Returns 3 if a read returned wrong
    bytes, else 0."""
    for step in itertools.islice(plan(seed), max_steps):
        line: dict = {"step": step.index, "op": step.op.value}
        if step.op is StepOp.PUT:
            pages = chain_for(step.namespace, step.digits)
            result = store.put(pages, [expected_page(p.key) for p in pages])
            line["stored"] = [k.hex() for k in result.stored]
            line["failed"] = len(result.failed)
        elif step.op is StepOp.GET:
            pages = chain_for(step.namespace, step.digits)
            got = store.get(pages)
            for p, t in zip(pages, got):
                if t is not None and not same_bytes(t, expected_page(p.key)):
                    print(f"wrong bytes read for {p.key.hex()}", file=sys.stderr)
                    return 3
            line["hits"] = sum(t is not None for t in got)
        elif step.op is StepOp.EVICT:
            from chunkstore.disk.maintenance import (
                evict_bytes,  # one-way cycle, as in the checks below
            )

            line["evicted"] = evict_bytes(store, step.evict_bytes).num_chunks
        else:
            line["deleted"] = store.delete_namespace(step.namespace).num_chunks
        say(json.dumps(line))
    return 0


# -- the checker (parent) -------------------------------------------------------------------

@dataclass(slots=True)
class CrashReport:
    cycles: int = 0
    keys_checked: int = 0
    hits: int = 0
    misses: int = 0
    failures: list[str] = field(default_factory=list)
    steps_committed: int = 0  # steps the writers reported, over all cycles
    kills_at_start: int = 0  # killed before the store was open
    temps_found: int = 0  # temp files present after a kill (all must be gone after open)
    rows_without_file: int = 0  # should stay 0: the store indexes a chunk only after its file
    orphan_files: int = 0  # files a kill left without a row (harmless), found by the periodic repair
    adopted: int = 0  # orphan files the repair indexed again
    durable_checked: int = 0  # pages of the last reported put that had to survive
    seed: int = 0
    elapsed_s: float = 0.0


class Spawn(enum.Enum):
    """How writers start. ``fork-server``: one helper process imports torch and the store once and
    forks a writer per cycle (a kill lands in store work, not in the 1-3 s of imports);
    ``exec``: each writer is a fresh `python -m chunkstore.testing.crash_soak writer`, delays counted from its
    'ready' line."""

    FORK_SERVER = "fork-server"
    EXEC = "exec"


@dataclass(slots=True)
class _Kill:
    seed: int
    delay_s: float
    lines: list[str]
    returncode: int | None
    stderr: str


def _writer_argv(disk_path: Path, seed: int, capacity_bytes: int, durability: Durability) -> list[str]:
    return ["--disk-path", str(disk_path), "--seed", str(seed), "--capacity-bytes", str(capacity_bytes),
            "--durability", durability.value]


def _pump(stream, sink: queue.Queue) -> None:
    for raw in stream:
        sink.put(raw.decode(errors="replace").rstrip("\n"))
    sink.put(None)  # EOF


class _ExecSpawner:
    def __init__(self, scratch: Path):
        self.scratch = scratch

    def close(self) -> None:
        pass

    def kill_after(self, argv: list[str], seed: int, delay_s: float) -> _Kill:
        lines: queue.Queue = queue.Queue()
        with tempfile.TemporaryFile(dir=self.scratch) as err:
            proc = subprocess.Popen([sys.executable, "-m", "chunkstore.testing.crash_soak", "writer", *argv],
                                    stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
            pump = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
            pump.start()
            got: list[str] = []
            try:
                deadline = time.monotonic() + _STARTUP_TIMEOUT_S
                while READY_LINE not in got and time.monotonic() < deadline:
                    line = lines.get(timeout=_STARTUP_TIMEOUT_S)
                    if line is None:
                        break
                    got.append(line)
                time.sleep(delay_s)
            finally:
                proc.send_signal(signal.SIGKILL)  # does nothing if it has exited already
                proc.wait()
                pump.join()
                proc.stdout.close()
            while (line := lines.get()) is not None:
                got.append(line)
            err.seek(0)
            return _Kill(seed, delay_s, got, proc.returncode, err.read().decode(errors="replace"))


_NO_REPLY = object()


class _ForkServer:
    """Talks to `python -m chunkstore.testing.crash_soak fork-server` (see serve_forks)."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self._err = open(scratch / "fork-server.err", "w+b")
        self.proc = subprocess.Popen([sys.executable, "-m", "chunkstore.testing.crash_soak", "fork-server"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self._replies), daemon=True).start()

    def close(self) -> None:
        self.proc.stdin.close()  # the server exits at end of input
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()

    def _reply(self, what: str) -> str:
        line = self._replies.get(timeout=_STARTUP_TIMEOUT_S)
        if line is None or not line.startswith(what + " "):
            self._err.seek(0)
            raise RuntimeError(f"the soak fork server failed ({line!r}): "
                               f"{self._err.read().decode(errors='replace')[-2000:]}")
        return line[len(what) + 1:]

    def kill_after(self, argv: list[str], seed: int, delay_s: float) -> _Kill:
        out, err = self.scratch / "writer.out", self.scratch / "writer.err"
        request = {"argv": argv, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = int(self._reply("pid"))
        try:  # a reply before the delay is up means the writer ended by itself: do not kill then
            early = self._replies.get(timeout=delay_s) if delay_s else _NO_REPLY
        except queue.Empty:
            early = _NO_REPLY
        if early is _NO_REPLY:
            try:  # no 'exit' reply yet, so the server has (almost surely) not reaped it: still our child
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it exited and was reaped just now; its 'exit' reply follows
                pass
            code = int(self._reply("exit"))
        elif early is not None and early.startswith("exit "):
            code = int(early[5:])
        else:
            raise RuntimeError(f"the soak fork server failed (said {early!r})")
        lines = out.read_text(errors="replace").splitlines()
        return _Kill(seed, delay_s, lines, code, err.read_text(errors="replace"))


def serve_forks() -> int:
    """Read one JSON request a line from stdin; fork a writer for each, reply 'pid N', reap it,
    reply 'exit CODE'. Only imports happen here before forking: no threads, no torch work."""
    return serve_fork_requests(lambda req: main(["writer", *req["argv"]]))


def serve_fork_requests(run_child: Callable[[dict], int]) -> int:
    """The fork server's loop: read one JSON request a line from stdin ({"stdout", "stderr", and
    what ``run_child`` reads}); fork a child that runs ``run_child(request)`` with its output in
    those files and exits with its code; reply 'pid N', reap it, reply 'exit CODE'."""
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(f, fd)
                    os.close(f)
                code = run_child(req)
            except BaseException:  # noqa: BLE001 - the child must never return into the server loop
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


def reported_steps(lines: list[str]) -> list[dict]:
    """The JSON step lines of a writer's output (a line cut by the kill is left out)."""
    steps = []
    for line in lines:
        if line.startswith("{"):
            try:
                steps.append(json.loads(line))
            except ValueError:  # the last line may be cut by the kill
                pass
    return steps


def surviving_pages(seed: int, steps: list[dict]) -> set[bytes]:
    """Pages stored by the last reported put that no later step can have removed.

    Steps after that put: the ones reported since (gets, evictions, namespace deletes: a put
    would be the last put) and the one in flight when the kill came. An eviction may take any of
    the pages, a namespace delete those of its namespace; an in-flight put may evict to make room,
    which cannot reach these pages only while they are still the most recently used chunks, that
    is when nothing ran between the two puts.
    """
    puts = [s for s in steps if s["op"] == StepOp.PUT.value]
    if not puts:
        return set()
    last = puts[-1]
    in_flight = steps[-1]["step"] + 1 if steps else 0
    keys = {bytes.fromhex(h) for h in last["stored"]}
    namespace_of = {p.key: p.namespace for p in _universe()[0]}
    for step in itertools.islice(plan(seed), last["step"] + 1, in_flight + 1):
        if step.op is StepOp.EVICT or (step.op is StepOp.PUT and step.index != last["step"] + 1):
            return set()
        if step.op is StepOp.DELETE_NAMESPACE:
            keys = {k for k in keys if namespace_of[k] != step.namespace}
    return keys


@functools.cache
def _universe() -> tuple[list[PageRef], dict[bytes, torch.Tensor]]:
    pages = all_pages()
    return pages, {p.key: expected_page(p.key) for p in pages}


def check_store(store: ChunkStore, report: CrashReport | None = None,
                must_survive: set[bytes] | frozenset[bytes] = frozenset()) -> list[str]:
    """Check a soak store just opened after a kill; returns the broken invariants (empty if none).

    Loads every page the writer can write (so it touches access times, drops rows whose file is
    missing and quarantines corrupt files, as any reader would); ``must_survive`` pages must load.
    Adds to the counters of ``report`` when given.
    """
    from chunkstore.disk.maintenance import (
        verify,  # maintenance imports the store; keep the cycle one-way
    )

    report = report if report is not None else CrashReport()
    pages, expected = _universe()
    problems: list[str] = []
    if (n := len(store.payloads.leftovers())) != 0:
        problems.append(f"{n} temp files left in tmp/ after open")
    keys = [p.key for p in pages]
    quarantined_before = store.stats().quarantined
    before = store.exists(keys)
    got = store.get(pages)
    after = store.exists(keys)
    for p, was, t, now in zip(pages, before, got, after):
        if t is not None:
            report.hits += 1
            if not same_bytes(t, expected[p.key]):
                problems.append(f"WRONG BYTES served for {p.key.hex()}")
            if not was or not now:
                problems.append(f"{p.key.hex()} loaded but exists() said {was} before, {now} after")
        else:
            report.misses += 1
            report.rows_without_file += was
            if now:
                problems.append(f"{p.key.hex()} missed on get but exists() still True")
    report.keys_checked += len(pages)
    if (q := store.stats().quarantined - quarantined_before) != 0:
        problems.append(f"{q} chunk files were corrupt (quarantined on get)")
    report.durable_checked += len(must_survive)
    if lost := set(must_survive) - {p.key for p, t in zip(pages, got) if t is not None}:
        problems.append(f"{len(lost)} pages of the last committed put are gone, e.g. {min(lost).hex()}")
    v = verify(store)
    if v.corrupt or v.missing:
        problems.append(f"verify: {v.corrupt} corrupt, {v.missing} missing")
    if sum(u.num_chunks for u in store.namespace_usage()) != store.num_chunks():
        problems.append("per-namespace usage disagrees with the rows")
    return problems


def run_crash_cycles(disk_path: str | os.PathLike, cycles: int, rng_seed: int, progress: Progress | None = None,
                     *, capacity_bytes: int = DEFAULT_CAPACITY_BYTES, max_delay_s: float = DEFAULT_MAX_DELAY_S,
                     durability: Durability = Durability.NONE, repair_every: int = 10,
                     spawn: Spawn = Spawn.FORK_SERVER) -> dict:
    """Run ``cycles`` writer processes on the store at ``disk_path`` one after another, SIGKILL
    each (20%: right as it starts, before or while it opens the store; else after 2 ms to
    ``max_delay_s`` of writing), and check the store after each kill (see the module doc). Every
    ``repair_every`` cycles, ``verify(repair=True)`` adopts the files a kill left without a row.

    Returns CrashReport as a dict; ``failures`` names each broken invariant with its cycle and
    writer seed. Stops early if the store can no longer be opened. Raises ModelMismatchError if
    ``disk_path`` holds another model's store; RuntimeError if the fork server dies.
    """
    from chunkstore.disk.maintenance import verify

    disk_path = Path(disk_path)
    rng = random.Random(rng_seed)
    report = CrashReport(seed=rng_seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chunkstore-soak-io-") as scratch:
        spawner = _ForkServer(Path(scratch)) if spawn is Spawn.FORK_SERVER else _ExecSpawner(Path(scratch))
        try:
            for cycle in range(cycles):
                seed = rng.getrandbits(32)
                delay = 0.0 if rng.random() < 0.2 else rng.uniform(0.002, max_delay_s)
                kill = spawner.kill_after(_writer_argv(disk_path, seed, capacity_bytes, durability), seed, delay)
                steps = reported_steps(kill.lines)
                report.cycles += 1
                report.steps_committed += len(steps)
                report.kills_at_start += "open" not in kill.lines
                tag = f"cycle {cycle} (writer seed {seed}, killed after {delay * 1000:.0f} ms, {len(steps)} steps)"
                if kill.returncode != -signal.SIGKILL:
                    report.failures.append(f"{tag}: writer exited with {kill.returncode}: {kill.stderr[-2000:]}")
                if (disk_path / "tmp").is_dir():
                    report.temps_found += sum(1 for e in os.scandir(disk_path / "tmp") if e.name.startswith("tmp-"))
                if (disk_path / "store.json").is_file() or (disk_path / "index.db").exists():
                    try:
                        store = ChunkStore(disk_path, SOAK_IDENTITY, capacity_bytes=capacity_bytes,
                                           durability=durability, num_workers=2)
                    except Exception as exc:  # noqa: BLE001 - failing to open after a kill is the finding
                        report.failures.append(f"{tag}: the store no longer opens: {type(exc).__name__}: {exc}")
                        break
                    with store:
                        survivors = surviving_pages(seed, steps)
                        report.failures.extend(f"{tag}: {p}" for p in check_store(store, report, survivors))
                        if repair_every and (cycle + 1) % repair_every == 0:
                            rep = verify(store, repair=True)
                            report.orphan_files += rep.orphans
                            report.adopted += rep.adopted
                            if rep.quarantined:
                                report.failures.append(f"{tag}: repair quarantined {rep.quarantined} files")
                # else: killed before it created anything, nothing to check
                if progress:
                    progress(1)
        finally:
            spawner.close()
    report.elapsed_s = round(time.monotonic() - started, 3)
    return dataclasses.asdict(report)


# -- the `chunkstore soak crash` command ------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `chunkstore soak crash`: --iterations, --seed, and --disk-path and --json unless
    the parser has them already (a --disk-path of None means a fresh temporary folder). The
    other knobs of run_crash_cycles are for Python callers."""
    parser.add_argument("--iterations", type=int, default=500, help="writer processes to kill (default 500)")
    if "--disk-path" not in parser._option_string_actions:
        parser.add_argument("--disk-path", default=None,
                            help="folder of the soak store (default: a fresh temporary folder, "
                                 "removed afterwards unless a cycle failed)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the kill schedule (default: random)")
    if "--json" not in parser._option_string_actions:
        add_json_flag(parser)  # the same --json as every command (chunkstore/output.py)


def run(args: argparse.Namespace) -> int:
    """Run the crash soak; 0 if every cycle passed, 1 on any failure, 2 for bad input."""
    from tqdm import tqdm

    if args.iterations <= 0:
        print("chunkstore: error: --iterations must be positive", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    own_dir = args.disk_path is None
    disk_path = Path(tempfile.mkdtemp(prefix="chunkstore-soak-")) if own_dir else Path(args.disk_path)
    try:
        other = read_identity(disk_path)
    except (ValueError, KeyError) as exc:
        other = exc
    if other is not None and other != SOAK_IDENTITY:
        print(f"chunkstore: error: {disk_path} holds a store that is not a soak store ({other}); "
              "give the soak its own --disk-path", file=sys.stderr)
        return 2
    with tqdm(total=args.iterations, desc="crash cycles", unit="cycle", file=sys.stderr, disable=None,
              leave=False) as bar:
        result = run_crash_cycles(disk_path, args.iterations, seed, progress=bar.update)
    result["disk_path"] = str(disk_path)
    if own_dir and not result["failures"]:
        shutil.rmtree(disk_path, ignore_errors=True)
        result["disk_path"] = None
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"{result['cycles']} crash cycles in {result['elapsed_s']:.1f} s (seed {seed}): "
              f"{result['steps_committed']} steps committed, {result['keys_checked']} page checks, "
              f"{result['hits']} hits, {result['misses']} misses, {result['orphan_files']} orphan files, "
              f"{result['adopted']} adopted, {result['rows_without_file']} rows without a file, "
              f"{len(result['failures'])} failures")
        for f in result["failures"]:
            print(f"FAIL {f}")
        if result["failures"]:
            print(f"store kept at {disk_path}")
    return 1 if result["failures"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chunkstore.testing.crash_soak", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writer", help="the child: write soak steps until killed")
    w.add_argument("--disk-path", required=True)
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--capacity-bytes", type=int, default=DEFAULT_CAPACITY_BYTES)
    w.add_argument("--durability", choices=[d.value for d in Durability], default=Durability.NONE.value)
    w.add_argument("--max-steps", type=int, default=None)
    add_arguments(sub.add_parser("crash", help="kill writers and check the store after each kill"))
    sub.add_parser("fork-server", help="fork writers on request (used by crash)")
    args = parser.parse_args(argv)
    if args.command == "fork-server":
        return serve_forks()
    if args.command == "writer":
        return run_writer(args.disk_path, args.seed, capacity_bytes=args.capacity_bytes,
                          durability=Durability.parse(args.durability), max_steps=args.max_steps)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
