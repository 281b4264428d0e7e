#!/usr/bin/env bash
# Install torch==$2 into the interpreter $1, choosing the build for this machine:
#   1. a local wheel if pip's find-links has one (offline, fast; on this project's machines a CPU build);
#   2. otherwise, without a CUDA driver, the CPU build from PyTorch's CPU index (not the multi-GB CUDA build);
#   3. otherwise the default (CUDA) build from PyPI.
set -euo pipefail
py=$1; version=$2
if "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$version' else 1)" 2>/dev/null; then
  exit 0
fi
if "$py" -m pip install -q --no-index --no-deps "torch==$version" 2>/dev/null; then
  "$py" -m pip install -q "torch==$version"  # its dependencies, from the usual index; torch itself is satisfied
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  "$py" -m pip install -q "torch==$version" --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
else
  "$py" -m pip install -q "torch==$version"
fi
"$py" -c "import torch; print(f'torch {torch.__version__}, CUDA build: {torch.version.cuda}, CUDA available: {torch.cuda.is_available()}')"
