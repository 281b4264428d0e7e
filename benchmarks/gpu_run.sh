#!/usr/bin/env bash
# The GPU run on the GPU host, in the project's root, after benchmarks/gpu_prepare.sh here (issue 44): installs
# gpu_bundle/wheels with pip --no-index --target, runs every figure, writes gpu_run.json and the logs into
# $OUT (else gpu_bundle/results). Options: benchmarks/gpu_run.py run --help.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-python3}" benchmarks/gpu_run.py run "$@"
