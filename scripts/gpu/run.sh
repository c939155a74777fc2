#!/usr/bin/env bash
# The CUDA path, measured in one run: the CUDA tests, then `bench tiers`, `bench store` from and
# into device memory, and `bench multiturn` on a 1B Llama-shaped model, each step's figures written
# as JSON under the output folder as soon as the step ends, so that a run cut short still returns
# the first parts. summary.json (rewritten after every step) holds each step's exit code and time,
# the tests' counts, and the GPU run's targets computed from the benchmarks' figures.
#
#   scripts/gpu/run.sh [--cpu] [--out DIR] [--wheels DIR] [--budget-s N]
#
#   --cpu        the same steps on the CPU with the tiny model and small sizes (CI runs it so this
#                script cannot rot); exit 1 when a step fails or its JSON lacks a figure
#   --out DIR    where the JSON goes (default: $OUT when set, else ./gpu-run)
#   --wheels DIR wheels to install first into a folder of their own (default .whl when its
#                manifest names this Python's version: what scripts/gpu/prepare.sh downloaded)
#   --budget-s N the whole run's limit in seconds (default 470; each step gets at most its share)
#
# Files written: environment.json, tests.json, tiers.json, store.json, multiturn.json,
# summary.json, run.log. Exit code: 0 when every step ran to its end, 1 otherwise.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODE=cuda
OUT_DIR=${OUT:-$PWD/gpu-run}
WHEELS=""
BUDGET_S=470
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu; shift ;;
        --out) OUT_DIR=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --budget-s) BUDGET_S=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "run.sh: --budget-s takes whole seconds, got '$BUDGET_S'" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/chunkstore-gpu-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STEPS="$WORK/steps"
: > "$STEPS"
exec > >(tee "$OUT_DIR/run.log") 2>&1
TEE_PID=$!
DEADLINE=$((SECONDS + BUDGET_S))
export PYTHONUNBUFFERED=1

# The carried wheels go to a folder of their own, ahead of the machine's packages; the checkout
# itself is importable (nothing is installed into the machine's Python).
PY_VERSION=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ -z "$WHEELS" ] && [ -f "$ROOT/.whl/manifest.json" ] \
        && grep -q "\"python_version\": \"$PY_VERSION\"" "$ROOT/.whl/manifest.json"; then
    WHEELS="$ROOT/.whl"
fi
SITE_PATH=""
if [ -n "$WHEELS" ]; then
    SITE="$WORK/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
        || { echo "run.sh: installing the wheels of $WHEELS failed" >&2; exit 1; }
    SITE_PATH="$SITE:"
fi
export PYTHONPATH="$SITE_PATH$ROOT${PYTHONPATH:+:$PYTHONPATH}"
echo "run.sh: $MODE mode, Python $PY_VERSION, wheels: ${WHEELS:-none}, output: $OUT_DIR, budget ${BUDGET_S}s"

# finish RC: let tee write the log's last lines before exiting (the output folder is collected then).
finish() {
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    exit "$1"
}

summarize() {
    "$PY" "$ROOT/scripts/gpu/report.py" summary "$OUT_DIR" "$STEPS" "$@"
}

# step NAME SHARE_S COMMAND...: run COMMAND for at most SHARE_S seconds (less when the run's
# deadline comes first, keeping 15 s for the summary), record its exit code and time, summarize.
# Out of time, COMMAND gets SIGINT (pytest then still writes its report), and SIGKILL 10 s later.
step() {
    local name=$1 share=$2
    shift 2
    local left=$((DEADLINE - SECONDS - 15))
    local limit=$((share < left ? share : left))
    if [ "$limit" -lt 5 ]; then
        echo "run.sh: no time left for $name"
        echo "$name 124 0 0" >> "$STEPS"
        summarize
        return
    fi
    echo "== $name (at most ${limit}s): $*"
    local start=$SECONDS
    timeout -s INT -k 10 "$limit" "$@"
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start))s"
    echo "$name $rc $((SECONDS - start)) $limit" >> "$STEPS"
    summarize
}

CS=("$PY" -m chunkstore)
# The CUDA-only cases first, in a run of their own; then every other test of the cache and the
# engine, whose pools, copies and model run on the device when there is one.
CUDA_TESTS=(tests/test_store_cuda.py tests/cache/test_pools_cuda.py tests/cache/test_tiered_cuda.py
            tests/test_bench_store.py::test_pages_put_from_and_loaded_into_device_memory)
if [ "$MODE" = cuda ]; then
    TESTS=(tests/cache tests/engine --ignore=tests/cache/test_pools_cuda.py --ignore=tests/cache/test_tiered_cuda.py)
    TIERS=(--size-mb 2048)  # 8 loads of 128 pages per path: 7 timed host->device, 8 disk->device
    STORE=(--device cuda --size-mb 1024 --index-rows 100000)
    # Prefill dominates: a 1B model in bf16, four rounds of 1k-token questions (contexts up to ~4k
    # tokens), 48 clients; the memory tiers hold a quarter of the histories (the default budgets).
    MULTITURN=(--preset llama-1b --dtype bfloat16 --num-clients 48 --num-rounds 4 --request-length 1024
               --output-length 4 --request-rate inf --max-parallel 4)
    SHARES=(40 60 110 75 60)  # environment, CUDA tests, tests, tiers, store; multiturn gets what is left
else
    TESTS=(tests/cache/test_pools.py)
    TIERS=(--size-mb 16 --batch-pages 4 --conversations 20 --requests 3 --request-tokens 512)
    STORE=(--device cpu --size-mb 16 --batch-pages 4 --index-rows 1000)
    MULTITURN=(--preset tiny --num-clients 4 --num-rounds 2 --request-length 32 --output-length 2 --request-rate inf)
    SHARES=(60 120 120 120 120)
fi

cd "$ROOT" || exit 2
step environment "${SHARES[0]}" "$PY" scripts/gpu/report.py environment "$OUT_DIR/environment.json" ${WHEELS:+--wheels "$WHEELS"}
if [ "$(tail -1 "$STEPS" | cut -d' ' -f2)" != 0 ]; then
    echo "run.sh: chunkstore does not import here (environment.json says why); nothing else can run." \
         "${WHEELS:-No wheels were installed: run scripts/gpu/prepare.sh where an index is reachable and bring .whl/ along.}" >&2
    finish 1
fi
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -o addopts=-ra --timeout 120)
step cuda-tests "${SHARES[1]}" "${PYTEST[@]}" --junitxml "$WORK/cuda-tests.xml" "${CUDA_TESTS[@]}"
step tests "${SHARES[2]}" "${PYTEST[@]}" --junitxml "$WORK/tests.xml" "${TESTS[@]}"
"$PY" scripts/gpu/report.py tests "$OUT_DIR/tests.json" "$WORK/cuda-tests.xml" "$WORK/tests.xml"
summarize
step tiers "${SHARES[3]}" "${CS[@]}" bench tiers --no-progress -o "$OUT_DIR/tiers.json" "${TIERS[@]}"
step store "${SHARES[4]}" "${CS[@]}" bench store --no-progress -o "$OUT_DIR/store.json" "${STORE[@]}"
step multiturn "$BUDGET_S" "${CS[@]}" bench multiturn --no-progress -o "$OUT_DIR/multiturn.json" "${MULTITURN[@]}"

summarize --check
rc=$?
echo "run.sh: done in $((SECONDS))s; summary: $OUT_DIR/summary.json"
finish $rc
