#!/usr/bin/env bash
# The GPU run's preparation, here on a CPU machine with network (issue 44): writes gpu_bundle/ (ignored by
# git) with the wheels the GPU image lacks (DeepSpeed built from its sdist, pydantic & co.), the token
# shards and tokenizer, and the train configs, and prints the carried size. Options: benchmarks/gpu_run.py
# prepare --help. Then, on the GPU host, in the project's root: python3 benchmarks/gpu_run.py run
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-.venv/bin/python}" benchmarks/gpu_run.py prepare "$@"
