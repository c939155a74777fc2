#!/usr/bin/env bash
# Builds the virtual environment in which chunkstore's SGLang backend is tested against SGLang's
# own HiCache code (tests marked `sglang`). SGLang's memory pools import torchvision, whose build
# on the package index needs the CUDA build of torch (it runs on CPU too), so this environment
# pins torch 2.14.1 + torchvision 0.29.1 apart from the main one (~6 GB, a few minutes).
# Usage: scripts/sglang_env.sh [VENV_DIR]   (default: .venv-sglang in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-sglang}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import sglang, chunkstore" 2>/dev/null; then
    echo "$venv: ready"; exit 0
fi
python3 -m venv "$venv"
constraints="$(mktemp)"; trap 'rm -f "$constraints"' EXIT
printf 'torch==2.14.1\ntorchvision==0.29.1\n' >"$constraints"
pip="$venv/bin/python -m pip install --quiet --constraint $constraints"
$pip torch==2.14.1 torchvision==0.29.1
# SGLang without its GPU dependency tree; what its HiCache modules import, pure Python:
$pip --no-deps sglang==0.5.23
$pip orjson pybase64 msgspec pyzmq psutil aiohttp IPython pillow dill gguf sentencepiece \
    compressed-tensors apache-tvm-ffi triton transformers requests tqdm numpy
# chunkstore itself and its test tools.
$pip -e '.[dev]'
"$venv/bin/python" -c "import sglang.srt.mem_cache.hicache_storage, chunkstore; print('$venv: ready')"
