#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), the wheels that scripts/gpu/run.sh installs on a bare GPU
# machine: Python 3.12 with torch and the packages in scripts/gpu/machine-packages.txt, no index.
# Run it here, in the checkout, with the project installed (pip install -e .); options: wheels.py --help.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 scripts/gpu/wheels.py "$@"
