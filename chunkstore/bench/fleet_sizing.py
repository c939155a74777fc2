"""The shared tier's capacity model, from what ``bench fleet --simulate-servers`` measures: the
database's CPU and statements are a fixed part (its own upkeep: autovacuum, checkpoints) plus a
part per request, fitted as a line over the fleet sizes that did not saturate the machine (by
relative error, what each N is checked by); the bucket's requests follow from the workload's
pages; a bounded tier's evictor lock, which the fleet's puts pass one at a time, is held for a
time per request (the largest unsaturated fleet's: small fleets' tiers are too small to evict
ahead), which bounds the fleet whatever the database's cores. The model predicts what N servers
at a request rate cost, and each N measured checks it. Docs: FLEET.md, "Sizing".

Invariants: the model is linear in requests (nothing in a request's cost grows with the fleet:
the per-request targets below test that); a prediction uses the requests/s each N actually served
(its trace is Poisson), so a check measures the model, not the arrivals; a saturated point is
checked and shown but neither fitted nor counted in the model's error; targets are reported,
never asserted.
"""

from __future__ import annotations

import math

from chunkstore.bench.common import Target, record_targets

UTILIZATION = 0.7  # the busiest a database or a gateway is planned to run
MODEL_ERROR_TARGET = 0.25  # each measured N within this of the model's prediction
PER_REQUEST_TARGET = 1.2  # database CPU and statements per request at the largest N / the smallest
LOOKUP_P99_TARGET = 3.0  # p99 lookup at the largest N / the smallest
SATURATED_BUSY = 0.8  # a point whose machine was this busy, or whose requests ran late, measured the
SATURATED_LATE = 0.1  # machine (or the evictor lock), not the tier: the model is not fitted on it
EXAMPLE_CORES = (4, 8, 16)
EXAMPLE_RATES = (1.0, 5.0, 20.0)  # requests per second per server


def is_saturated(point: dict) -> bool:
    return point["machine_busy_share"] >= SATURATED_BUSY or point["late_share"] >= SATURATED_LATE


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the line with the least sum of squared relative errors (predicted /
    measured - 1) over the points: the model is checked by its relative error at each N, so a
    point of 0.01 cores counts as much as one of 0.3 (a plain least-squares line followed the
    large points and missed the smallest by 60%). The intercept is at least 0 (else the slope is
    fitted through the origin); points measured at 0 or below have no relative error and are
    left out."""
    points = [(x, y) for x, y in zip(xs, ys) if y > 0]
    if not points:
        return 0.0, 0.0
    # Each point asks a / y + b * x / y = 1: least squares on those equations.
    s11 = sum(1 / y ** 2 for _, y in points)
    s12 = sum(x / y ** 2 for x, y in points)
    s22 = sum((x / y) ** 2 for x, y in points)
    t1 = sum(1 / y for _, y in points)
    t2 = sum(x / y for x, y in points)
    det = s11 * s22 - s12 * s12
    if det > 1e-9 * s11 * s22:
        intercept, slope = (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det
        if intercept >= 0:
            return intercept, slope
    return 0.0, (t2 / s22 if s22 else 0.0)


def bucket_requests_per_request(point: dict) -> float:
    """A request's bucket requests by the workload's pages: one PUT per page stored, one GET per
    page loaded that the server's local copy did not have (a conversation's rounds on other
    servers miss it), one DeleteObjects for the eviction that makes room (a full tier)."""
    gets = point["loaded_pages_per_request"] - point["local_copy_hits_per_request"]
    return point["stored_pages_per_request"] + gets + 1.0


def sizing_model(points: list[dict], rate_per_server: float) -> dict:
    """The database's CPU and statements as a fixed part plus a part per request (a line fitted
    on the unsaturated points), the bucket's requests from the workload's pages; each N's
    prediction against what was measured, and the servers one database of K cores serves."""
    fitted = [p for p in points if not is_saturated(p)]
    if len(fitted) < 2:
        fitted = points
    rates = [p["requests_per_s"] for p in fitted]
    db_fixed, db_per_request = fit_line(rates, [p["db_cores"] for p in fitted])
    st_fixed, st_per_request = fit_line(rates, [p["statements_per_1000_requests"] / 1000 * p["requests_per_s"]
                                                for p in fitted])
    checks = []
    for p in points:
        rate = p["requests_per_s"]
        measured = {"db_cores": p["db_cores"],
                    "statements_per_s": p["statements_per_1000_requests"] / 1000 * rate,
                    "bucket_requests_per_s": None if p["bucket_requests_per_request"] is None
                    else p["bucket_requests_per_request"] * rate}
        predicted = {"db_cores": db_fixed + db_per_request * rate, "statements_per_s": st_fixed + st_per_request * rate,
                     "bucket_requests_per_s": bucket_requests_per_request(p) * rate}
        errors = {k: predicted[k] / measured[k] - 1 for k in measured if measured[k]}
        checks.append({"servers": p["servers"], "requests_per_s": rate, "saturated": is_saturated(p),
                       "measured": measured, "predicted": predicted, "error": errors})
    usable = [c for c in checks if not c["saturated"]] or checks
    lock_from = max(fitted, key=lambda p: p["servers"])
    locks: dict = {"lock_from_servers": lock_from["servers"]}
    for lock in ("evictor_lock", "room_lock"):
        held_s = lock_from[lock]["held_s_per_request"]
        locks.update({f"{lock}_s_per_request": held_s, f"{lock}_pass_ms": lock_from[lock]["pass_ms"],
                      f"servers_by_{lock}": {f"{rate:g}/s": servers_by_lock(rate, held_s) for rate in EXAMPLE_RATES}})
    return {
        "fitted_on_servers": [p["servers"] for p in fitted],
        "db_fixed_cores": db_fixed, "db_cpu_s_per_request": db_per_request,
        "statements_fixed_per_s": st_fixed, "statements_per_request": st_per_request,
        "utilization": UTILIZATION, "checks": checks,
        "max_error": max((abs(e) for c in usable for e in c["error"].values()), default=None),
        "servers_per_database": {f"{cores} cores": {f"{rate:g}/s": servers_served(cores, rate, db_fixed, db_per_request)
                                                     for rate in EXAMPLE_RATES} for cores in EXAMPLE_CORES},
        "rate_per_server_measured": rate_per_server,
        **locks,
    }


def servers_by_lock(rate_per_server: float, lock_s_per_request: float) -> int | None:
    """How many servers at ``rate_per_server`` requests/s one of a bounded tier's fleet-wide locks
    (the evictor lock, the room lock) serves, held UTILIZATION of the time, whatever the
    database's cores: the fleet passes it one at a time. None when no request holds it (an
    unbounded tier)."""
    if lock_s_per_request <= 0:
        return None
    return math.floor(UTILIZATION / (rate_per_server * lock_s_per_request) + 1e-9)  # (0.7 / 0.05 is 13.999...)


def servers_served(cores: float, rate_per_server: float, db_fixed_cores: float, db_cpu_s_per_request: float) -> int | None:
    """How many servers at ``rate_per_server`` requests/s one database of ``cores`` serves at
    UTILIZATION, by its CPU; None when a request costs it nothing measurable."""
    if db_cpu_s_per_request <= 0:
        return None
    return max(0, math.floor((cores * UTILIZATION - db_fixed_cores) / (rate_per_server * db_cpu_s_per_request)))


def scale_targets(result: dict) -> None:
    """Record the scale targets: per-request database costs and p99 lookup at the largest N
    against the smallest, and the model's largest error."""
    points = sorted(result["points"], key=lambda p: p["servers"])
    small, large = points[0], points[-1]

    def ratio(name: str) -> float:
        return large[name] / small[name] if small[name] else float("inf")

    p99_small, p99_large = small["lookup_ms"]["p99"], large["lookup_ms"]["p99"]
    targets = [
        Target("db_cpu_per_request_largest_vs_smallest", ratio("db_cpu_s_per_1000_requests"), "<=",
               PER_REQUEST_TARGET),
        Target("statements_per_request_largest_vs_smallest", ratio("statements_per_1000_requests"), "<=",
               PER_REQUEST_TARGET),
        Target("lookup_p99_largest_vs_smallest", p99_large / p99_small if p99_small else float("inf"), "<=",
               LOOKUP_P99_TARGET),
    ]
    if (error := result["model"]["max_error"]) is not None:
        targets.append(Target("model_max_error", error, "<=", MODEL_ERROR_TARGET))
    record_targets(result, targets)
