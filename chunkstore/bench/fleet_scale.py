"""``chunkstore bench fleet --simulate-servers 1,2,4,...``: how the shared tier's cost grows with
the fleet. For each N, N simulated servers (fleet_sim_server.py: each a process of its own with its
own store, local copy and connection pool, no model) replay one multi-turn trace (fleet_trace.py)
at the same request rate per server against one PostgreSQL and one S3 server started for the run;
the figures per request (database CPU and statements, bucket requests) and the latencies (lookup,
load, publish) are compared across N.

Invariants: every N starts on a fresh database and bucket prefix, fills its tier during a warm-up
(its capacity is ``capacity_s`` seconds of the fleet's publishes, so every N measures a full tier
that evicts) and is measured after it, from the end of the warm-up until every server has served
its last request; the probes (fleet_probes.py) cover exactly that window. The request rate per
server is low enough that 32 servers, PostgreSQL and the S3 server share this machine's 2 cores
(the machine's busy share is reported with every N). Targets are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chunkstore.bench import fleet_probes as probes
from chunkstore.bench.fleet_sim_server import ServerPlan
from chunkstore.bench.fleet_trace import TraceConfig

PROG = "chunkstore bench fleet"
BUCKET = "fleet-scale"
SIM_IDENTITY = {"model_id": "fleet-sim", "kv_dtype": "bfloat16", "num_layers": 2, "num_kv_heads": 2,
                "head_dim": 32, "page_size": 16}  # 8 KiB pages: the index's and the bucket's requests, not bandwidth
HEADER_ALLOWANCE_BYTES = 1024  # a chunk's header beside its payload, for the capacity's size
READY_TIMEOUT_S = 600.0  # 32 processes importing torch and opening a store on 2 cores
IDLE_S = 5.0  # measured with every server ready and idle, before the trace starts (a server's own upkeep)
LATE_S = 0.05  # a request that began this much after its time is counted late


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    servers: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    # Requests per second per server: 32 servers, PostgreSQL and radosgw then keep this machine's 2
    # cores below saturation (at 1 per second they do not: 16 servers already served less than asked).
    rate_per_server: float = 0.5
    warmup_s: float = 25.0
    duration_s: float = 30.0  # measured, per N (at least min_requests requests)
    min_requests: int = 60
    # The tier's capacity in seconds of the fleet's publishes (None: unbounded): above the live
    # conversations' pages (rounds x think_s x 5 pages a second per request), below the warm-up's.
    capacity_s: float | None = 20.0
    think_s: float = 4.0
    rounds: int = 4
    tenants: int = 4
    local_copy_bytes: int = 64 << 20
    seed: int = 0
    show_progress: bool = True
    trace_overrides: dict = field(default_factory=dict)  # other TraceConfig fields
    pg_settings: dict = field(default_factory=dict)  # the throwaway PostgreSQL's (e.g. shared_buffers)

    def __post_init__(self) -> None:
        if not self.servers or any(n < 1 for n in self.servers):
            raise ValueError("--simulate-servers takes server counts of at least 1, e.g. 1,2,4,8,16,32")
        if self.rate_per_server <= 0 or self.warmup_s < 0 or self.duration_s <= 0 or self.min_requests < 0:
            raise ValueError("--sim-rate and --sim-duration must be positive, --sim-warmup at least 0")
        if self.capacity_s is not None and self.capacity_s <= 0:
            raise ValueError("--sim-capacity-s must be positive")

    def measured_s(self, servers: int) -> float:
        """The measured part for ``servers``: ``duration_s``, longer when that holds fewer than
        ``min_requests`` requests."""
        return max(self.duration_s, self.min_requests / (servers * self.rate_per_server))

    def trace(self, servers: int) -> TraceConfig:
        return TraceConfig(servers=servers, rate_per_server=self.rate_per_server,
                           duration_s=self.warmup_s + self.measured_s(servers), think_s=self.think_s,
                           rounds=self.rounds, tenants=self.tenants, seed=self.seed, **self.trace_overrides)


# ---- the services -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Services:
    postgres: object  # a PostgresServer (pg_stat_statements loaded)
    s3: object  # a RadosGateway, or moto's server where Ceph is missing
    description: str


@contextlib.contextmanager
def services(work: Path, pg_settings: dict[str, str] | None = None) -> Iterator[Services]:
    """A throwaway PostgreSQL server (with pg_stat_statements) and S3 server on 127.0.0.1, the
    bucket made and the AWS_* variables set for the simulated servers (restored after)."""
    from chunkstore.testing.moto_s3 import MotoS3Server
    from chunkstore.testing.postgres import PostgresServer
    from chunkstore.testing.radosgw import RadosGateway, RadosGatewayNotInstalled

    try:
        s3_server, s3_name = RadosGateway(work / "radosgw"), "Ceph's RADOS Gateway"
    except RadosGatewayNotInstalled:
        s3_server, s3_name = MotoS3Server(log_path=work / "moto.log"), "moto's S3 server"
    with PostgresServer(work / "postgres", track_statements=True, settings=pg_settings) as pg, s3_server as s3:
        pg.enable_statement_stats()
        s3.create_bucket(BUCKET)
        with s3.in_environment():
            yield Services(pg, s3, f"PostgreSQL {pg.bin_dir.parent.name} and {s3_name} on 127.0.0.1")


# ---- one N ------------------------------------------------------------------------------------

class _Children:
    """The simulated servers of one N: started, told when to start, and collected."""

    def __init__(self, plans: list[ServerPlan], folder: Path):
        self.results = [folder / f"server-{p.server}.result.json" for p in plans]
        self.procs: list[subprocess.Popen] = []
        for plan, result in zip(plans, self.results):
            plan_path = folder / f"server-{plan.server}.plan.json"
            plan_path.write_text(plan.to_json())
            with open(folder / f"server-{plan.server}.log", "wb") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "chunkstore.bench.fleet_sim_server", str(plan_path), str(result)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1))
        self.logs = [folder / f"server-{p.server}.log" for p in plans]

    def expect(self, word: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc, log in zip(self.procs, self.logs):
            line = _readline(proc, deadline)
            if line.strip() != word:
                raise RuntimeError(f"a simulated server said {line.strip()!r}, not {word!r}; its log ({log}):\n"
                                   f"{log.read_text()[-3000:]}")

    def tell(self, line: str) -> None:
        for proc in self.procs:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()

    def collect(self, timeout_s: float = 120.0) -> list[dict]:
        import json

        for proc, log in zip(self.procs, self.logs):
            if proc.wait(timeout_s) != 0:
                raise RuntimeError(f"a simulated server exited with {proc.returncode}; its log ({log}):\n"
                                   f"{log.read_text()[-3000:]}")
        return [json.loads(r.read_text()) for r in self.results]

    def kill(self) -> None:
        for proc in self.procs:  # each by its own PID
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _readline(proc: subprocess.Popen, deadline: float) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(max(0.0, deadline - time.monotonic())):
            return "(nothing: timed out)"
    return proc.stdout.readline() or f"(nothing: exited with {proc.poll()})"


@dataclass(frozen=True, slots=True)
class _Snapshot:
    at: float
    db_cpu_s: float
    s3_cpu_s: float
    servers_cpu_s: float  # the simulated servers' processes
    busy_s: float
    total_s: float
    rgw: dict | None


def _snapshot(svc: Services, children: _Children) -> _Snapshot:
    busy, total = probes.machine_busy_s()
    return _Snapshot(time.monotonic(), probes.tree_cpu_s(svc.postgres.pid), probes.process_cpu_s(probes.s3_pids(svc.s3)),
                     probes.process_cpu_s([p.pid for p in children.procs]), busy, total, probes.rgw_counters(svc.s3))


def run_point(cfg: ScaleConfig, servers: int, svc: Services, work: Path) -> dict:
    """N = ``servers`` simulated servers on a fresh tier: the figures of its measured window."""
    database = f"scale_n{servers}"
    index_url = svc.postgres.create_database(database)
    trace = cfg.trace(servers)
    page_bytes = _page_bytes()
    capacity = None if cfg.capacity_s is None else \
        math.ceil(trace.fleet_rate * trace.pages_per_round * cfg.capacity_s) * (page_bytes + HEADER_ALLOWANCE_BYTES)
    folder = work / f"n{servers}"
    folder.mkdir()
    plans = [ServerPlan(server=i, trace=trace, folder=str(folder / f"server-{i}"), index_url=index_url,
                        object_store=f"s3://{BUCKET}/n{servers}", capacity_bytes=capacity,
                        local_copy_bytes=cfg.local_copy_bytes, identity=SIM_IDENTITY) for i in range(servers)]
    children = _Children(plans, folder)
    try:
        children.expect("ready", READY_TIMEOUT_S)
        statements = probes.StatementCounts(index_url, database)
        sampler = probes.ActivitySampler(index_url, database)
        statements.reset()
        idle_from = _snapshot(svc, children)
        time.sleep(IDLE_S)
        idle = _idle(idle_from, _snapshot(svc, children), statements.read())
        start_at = time.time() + 1.0
        children.tell(repr(start_at))
        time.sleep(max(0.0, start_at + cfg.warmup_s - time.time()))
        statements.reset()
        sampler.start()
        before = _snapshot(svc, children)
        children.expect("done", cfg.measured_s(servers) + 300.0)
        after = _snapshot(svc, children)
        activity = sampler.stop()
        counted = statements.read()
        statements.close()
        children.tell("exit")
        results = children.collect()
    finally:
        children.kill()
    svc.postgres.drop_database(database)
    return summarize(servers, cfg, trace, results, before, after, counted, activity, idle)


def _idle(before: _Snapshot, after: _Snapshot, counted: dict) -> dict:
    """What the database did while every server was ready and idle: its own upkeep and the
    servers' (counters flushed, connections checked)."""
    window_s = after.at - before.at
    return {"db_cores": (after.db_cpu_s - before.db_cpu_s) / window_s, "statements_per_s": counted["calls"] / window_s}


def _page_bytes() -> int:
    from chunkstore.disk.identity import ModelIdentity

    return ModelIdentity(**SIM_IDENTITY).page_size_bytes


# ---- the figures ------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0-100) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _latency_ms(values: list[float]) -> dict:
    return {"p50": _ms(percentile(values, 50)), "p99": _ms(percentile(values, 99)), "n": len(values)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def summarize(servers: int, cfg: ScaleConfig, trace: TraceConfig, results: list[dict], before: _Snapshot,
              after: _Snapshot, counted: dict, activity: probes.ActivitySummary, idle: dict) -> dict:
    measured = [r for res in results for r in res["requests"] if r["at_s"] >= cfg.warmup_s]
    n = len(measured) or 1
    window_s = after.at - before.at
    copies = [res["local_copy"] for res in results if res["local_copy"]]
    rgw = None if before.rgw is None or after.rgw is None else {k: after.rgw[k] - before.rgw[k] for k in before.rgw}
    db_cpu_s = after.db_cpu_s - before.db_cpu_s

    def per_request(total: float) -> float:
        return total / n

    return {
        "servers": servers, "requests": len(measured), "window_s": window_s,
        "offered_requests_per_s": trace.fleet_rate, "requests_per_s": len(measured) / window_s,
        "late_share": sum(1 for r in measured if r["late_s"] > LATE_S) / n,
        "lookup_ms": _latency_ms([r["lookup_s"] for r in measured]),
        "load_ms": _latency_ms([r["load_s"] for r in measured if r["load_s"] is not None]),
        "publish_ms": _latency_ms([r["publish_s"] for r in measured if r["put_pages"]]),
        "hit_pages_per_request": per_request(sum(r["hit_pages"] for r in measured)),
        "loaded_pages_per_request": per_request(sum(r["loaded_pages"] for r in measured)),
        # of them, read from the server's own local copy (no GET): a conversation's earlier rounds
        # on the same server (always with one server, every other round with two)
        "local_copy_hits_per_request": per_request(sum(r["local_copy_hits"] for r in measured)),
        "stored_pages_per_request": per_request(sum(r["stored"] for r in measured)),
        "pages_deduplicated": sum(r["deduplicated"] for r in measured),
        "pages_failed": sum(r["failed"] for r in measured),
        "db_cpu_s": db_cpu_s, "db_cores": db_cpu_s / window_s, "idle": idle,
        "db_cpu_s_per_1000_requests": per_request(db_cpu_s) * 1e3,
        "db_cpu_s_per_1000_requests_beyond_idle": per_request(max(0.0, db_cpu_s - idle["db_cores"] * window_s)) * 1e3,
        "statements_per_1000_requests": per_request(counted["calls"]) * 1e3,
        "db_exec_ms_per_request": per_request(counted["exec_ms"]),
        # the prefix lookup's execution in the database (pg_stat_statements), beside "lookup_ms" as
        # the servers saw it: what the rest of a lookup's time is not (round trips, wake-ups)
        "lookup_db_ms": counted["lookup"],
        "top_statements": counted["top"],
        "bucket_requests_per_request": None if rgw is None else per_request(rgw["req"]),
        "bucket_gets_per_request": None if rgw is None else per_request(rgw["get"]),
        "bucket_puts_per_request": None if rgw is None else per_request(rgw["put"]),
        "s3_cpu_ms_per_request": per_request(after.s3_cpu_s - before.s3_cpu_s) * 1e3,
        "servers_cpu_ms_per_request": per_request(after.servers_cpu_s - before.servers_cpu_s) * 1e3,
        "machine_busy_share": (after.busy_s - before.busy_s) / max(after.total_s - before.total_s, 1e-9),
        # what the fleet, PostgreSQL and the S3 server used of the machine (the rest: other work on it)
        "bench_busy_share": (after.db_cpu_s - before.db_cpu_s + after.s3_cpu_s - before.s3_cpu_s
                             + after.servers_cpu_s - before.servers_cpu_s) / max(after.total_s - before.total_s, 1e-9),
        "connections": {"max": activity.max_connections, "mean": activity.mean_connections},
        "evictor_lock": _lock_figures(measured, activity, window_s),
        "room_lock": _passes(measured, "room"),
        "local_copy": {"hits": sum(c["hits"] for c in copies), "misses": sum(c["misses"] for c in copies)},
    }


def _lock_figures(measured: list[dict], activity: probes.ActivitySummary, window_s: float) -> dict:
    """The fleet's evictor lock over the measured requests: sampled (held, waited for) and as the
    servers' stores counted their puts' passes (``_passes``; held seconds per request: the
    model's figure). Only a put that must evict takes it."""
    n = len(measured) or 1
    return {"waiting_share": activity.waiting_share, "mean_waiting": activity.mean_waiting,
            "held_share": activity.held_share, "samples": activity.samples,
            "sampled_held_s_per_request": activity.held_share * window_s / n, **_passes(measured, "lock")}


def _passes(measured: list[dict], lock: str) -> dict:
    """A lock's passes over the measured requests as the servers' stores counted them (``lock``:
    the records' prefix): held and waited seconds per request, passes per request, and one pass's
    hold at p50 and p90."""
    n = len(measured) or 1
    holds = sorted(r[f"{lock}_held_s"] for r in measured if r[f"{lock}_passes"])
    return {"held_s_per_request": sum(r[f"{lock}_held_s"] for r in measured) / n,
            "waited_s_per_request": sum(r[f"{lock}_waited_s"] for r in measured) / n,
            "passes_per_request": sum(r[f"{lock}_passes"] for r in measured) / n,
            "pass_ms": {"p50": _ms(percentile(holds, 50)), "p90": _ms(percentile(holds, 90)), "n": len(holds)}}


# ---- the benchmark ------------------------------------------------------------------------------

def run_scale_bench(cfg: ScaleConfig) -> dict:
    """Every N of ``cfg.servers`` in turn on one PostgreSQL and one S3 server; the sizing model
    fitted and checked (fleet_sizing.py); targets recorded."""
    from chunkstore.bench.fleet_sizing import scale_targets, sizing_model

    with tempfile.TemporaryDirectory(prefix="chunkstore-bench-fleet-scale-") as tmp:
        work = Path(tmp)
        with services(work, cfg.pg_settings) as svc:
            points = []
            for servers in cfg.servers:
                if cfg.show_progress:
                    print(f"{PROG}: {servers} simulated server(s), {cfg.measured_s(servers):.0f} s measured ...",
                          file=sys.stderr)
                points.append(run_point(cfg, servers, svc, work))
    result = {
        "setting": f"{', '.join(map(str, cfg.servers))} simulated servers (a process each, no model), "
                   f"{cfg.rate_per_server:g} requests/s each, {cfg.rounds}-round conversations of {cfg.tenants} "
                   f"tenants; {cfg.warmup_s:g} s warm-up, then at least {cfg.duration_s:g} s measured; tier "
                   f"capacity {'unbounded' if cfg.capacity_s is None else f'{cfg.capacity_s:g} s of publishes'}; "
                   f"on {svc.description}",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "points": points,
    }
    result["model"] = sizing_model(points, cfg.rate_per_server)
    scale_targets(result)
    return result


def format_scale_table(result: dict) -> str:
    from chunkstore.bench.common import table_lines, verdict, verdict_line

    def num(value, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    header = ("N", "req/s", "lookup p50/p99 ms", "in db mean/max", "load p50/p99 ms", "publish p50/p99 ms",
              "db CPU s/1k req", "stmts/1k req", "bucket req/req", "conns", "lock held/wait", "dedup", "busy (fleet)")
    lines = [result["setting"], "", "  ".join(header)]
    for p in result["points"]:
        in_db = p.get("lookup_db_ms") or {}
        lines.append("  ".join([
            f"{p['servers']:>2}", f"{p['requests_per_s']:5.1f}",
            f"{num(p['lookup_ms']['p50'])}/{num(p['lookup_ms']['p99'])}",
            f"{num(in_db.get('mean_ms'))}/{num(in_db.get('max_ms'))}",
            f"{num(p['load_ms']['p50'], '.1f')}/{num(p['load_ms']['p99'], '.1f')}",
            f"{num(p['publish_ms']['p50'], '.1f')}/{num(p['publish_ms']['p99'], '.1f')}",
            f"{p['db_cpu_s_per_1000_requests']:.2f}", f"{p['statements_per_1000_requests']:.0f}",
            num(p["bucket_requests_per_request"]), f"{p['connections']['max']}",
            f"{p['evictor_lock']['held_share']:.0%}/{p['evictor_lock']['waiting_share']:.0%}",
            f"{p['pages_deduplicated']}",
            f"{p['machine_busy_share']:.0%} ({p['bench_busy_share']:.0%})"]))
    model = result["model"]
    fitted = ",".join(map(str, model["fitted_on_servers"]))
    rows = [(f"model (fitted on N={fitted}): database CPU ms per request", f"{model['db_cpu_s_per_request'] * 1e3:.2f}",
             "", ""),
            ("  database cores, fixed", f"{model['db_fixed_cores']:.3f}", "", ""),
            ("  statements per request (fixed per s)", f"{model['statements_per_request']:.1f}",
             f"({model['statements_fixed_per_s']:.1f})", "")]
    for lock in ("evictor_lock", "room_lock"):
        if model[f"{lock}_s_per_request"] > 0:
            bound = ", ".join(f"{n} at {rate}" for rate, n in model[f"servers_by_{lock}"].items())
            passes = model[f"{lock}_pass_ms"]
            rows.append((f"  {lock.replace('_', ' ')} held per request (N={model['lock_from_servers']}), ms",
                         f"{model[f'{lock}_s_per_request'] * 1e3:.2f}",
                         f"(a pass {num(passes['p50'], '.1f')} / {num(passes['p90'], '.1f')} ms at p50 / p90)", ""))
            rows.append((f"  servers it serves, held {model['utilization']:.0%}", bound, "", ""))
    for check in model["checks"]:
        errors = ", ".join(f"{k} {v:+.0%}" for k, v in check["error"].items())
        rows.append((f"  N={check['servers']}{' (saturated)' if check['saturated'] else ''}: predicted vs measured",
                     errors, "", ""))
    for name, label in (("db_cpu_per_request_largest_vs_smallest", "database CPU per request, largest N / smallest"),
                        ("statements_per_request_largest_vs_smallest", "statements per request, largest N / smallest"),
                        ("lookup_p99_largest_vs_smallest", "p99 lookup, largest N / smallest"),
                        ("model_max_error", "model's largest error over the N measured")):
        if name in result["targets"]:
            rows.append((label, f"{result['targets'][name]['value']:.2f}", *verdict(result, name)))
    return "\n".join([*lines, "", *table_lines(rows, target_width=9), "", verdict_line(result)])
