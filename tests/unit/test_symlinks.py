"""Issue 42 item 4: symbolic links in a corpus (the "symlinks in a corpus" case of tests/cases/README.md).

The walk ends on a link cycle; a directory reachable under two names is read once, under its canonical
name (its own path in the corpus; for a target outside the corpus, the first link in sorted order);
a dangling link is a rejected record naming it; the same files give the same document ids, partitions
and fingerprint (raw_corpus's input version) whatever order the file system lists them in."""

import json
from pathlib import Path

import pyarrow as pa

from helpers.corpora import read_all
from largetrain_core.corpus import fingerprint, ingest, partition_of, read_corpus, scan
from largetrain_core.readers import ReaderConfig

FILES = {
    "docs/a.jsonl": [{"text": "alpha one"}, {"text": "alpha two"}],
    "docs/deep/b.txt": "a text file in a subdirectory",
    "notes.md": "top-level notes",
}


def _build(root: Path, outside: Path, order: list[str]) -> Path:
    """The case, its entries created in ``order`` (file systems list a directory in creation or hash
    order, so two orders give two listing orders): files, a link to a subdirectory of the corpus
    (``alias`` and ``0alias``: the same files under other names, one sorting before the real name), a
    link cycle, two links to one directory outside the corpus, a dangling link and a loop of links."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    outside.mkdir(exist_ok=True)
    if not (outside / "c.txt").exists():
        (outside / "c.txt").write_text("a file outside the corpus, reached by a link")
    steps = {
        "files": lambda: [_write(corpus / rel, body) for rel, body in FILES.items()],
        "alias": lambda: (corpus / "alias").symlink_to(corpus / "docs", target_is_directory=True),
        "0alias": lambda: (corpus / "0alias").symlink_to("docs/deep", target_is_directory=True),
        "cycle": lambda: (corpus / "docs" / "deep" / "up").symlink_to("../..", target_is_directory=True),
        "outside": lambda: [
            (corpus / name).symlink_to(outside, target_is_directory=True) for name in ("ext_b", "ext_a")
        ],
        "dangling": lambda: [
            (corpus / "gone.jsonl").symlink_to("../nowhere.jsonl"),
            (corpus / "gone_dir").symlink_to("../nowhere", target_is_directory=True),  # no suffix: rejected too
        ],
        "loop": lambda: [(corpus / "l1.txt").symlink_to("l2.txt"), (corpus / "l2.txt").symlink_to("l1.txt")],
    }
    for step in order:
        steps[step]()
    return corpus


def _write(path: Path, body) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if isinstance(body, str) else "".join(json.dumps(r) + "\n" for r in body))


ORDER = ["files", "alias", "0alias", "cycle", "outside", "dangling", "loop"]


def test_the_walk_ends_reads_each_file_once_under_its_canonical_name(tmp_path):
    corpus = _build(tmp_path, tmp_path / "elsewhere", ORDER)
    listed = scan(corpus)
    rels = [s.rel for s in listed.sources]
    # the aliases and the cycle are not followed (their targets are read under their own names); the two
    # links out of the corpus lead to one directory, read once under the first in sorted order; the dangling
    # link and the loop of links are listed, to be rejected
    assert rels == [
        "docs/a.jsonl",
        "docs/deep/b.txt",
        "ext_a/c.txt",
        "gone.jsonl",
        "gone_dir",
        "l1.txt",
        "l2.txt",
        "notes.md",
    ]
    assert rels == sorted(rels, key=lambda r: r.split("/"))

    docs, rej = read_all(corpus)
    assert docs.column("doc_id").to_pylist() == [
        "docs/a.jsonl:1",
        "docs/a.jsonl:2",
        "docs/deep/b.txt",
        "ext_a/c.txt",
        "notes.md",
    ]
    got = {r["source"]: (r["position"], r["reason"]) for r in rej.to_pylist()}
    assert got.keys() == {"gone.jsonl", "gone_dir", "l1.txt", "l2.txt"}
    assert got["gone.jsonl"] == (
        -1,
        "dangling symbolic link: its target ../nowhere.jsonl does not exist (or is a loop of links)",
    )
    assert got["gone_dir"][1].startswith("dangling symbolic link: its target ../nowhere does not exist")
    assert got["l1.txt"][1].startswith("dangling symbolic link: its target l2.txt does not exist")


def test_ids_partitions_and_fingerprint_do_not_depend_on_the_listing_order(tmp_path):
    """Two copies of the case whose entries were created in opposite orders, and so are listed
    differently, give the same ids, the same partition of each file and the same fingerprint."""
    a = _build(tmp_path / "a", tmp_path / "a" / "elsewhere", ORDER)
    b = _build(
        tmp_path / "b",
        tmp_path / "b" / "elsewhere",
        ["loop", "dangling", "outside", "0alias", "alias", "files", "cycle"],
    )
    results = []
    for corpus in (a, b):
        partitions = [[s.rel for s in scan(corpus, p, 3).sources] for p in range(3)]
        ids = [
            pa.concat_tables(
                [x.documents for x in read_corpus(ReaderConfig(str(corpus), partition=p, partitions=3))]
                or [pa.table({"doc_id": pa.array([], pa.large_string())})]
            )
            .column("doc_id")
            .to_pylist()
            for p in range(3)
        ]
        results.append((partitions, ids, fingerprint(corpus)))
    assert results[0] == results[1]
    partitions, ids, _ = results[0]
    assert all(partition_of(rel, 3) == p for p, rels in enumerate(partitions) for rel in rels)
    assert sorted(i for part in ids for i in part) == [
        "docs/a.jsonl:1",
        "docs/a.jsonl:2",
        "docs/deep/b.txt",
        "ext_a/c.txt",
        "notes.md",
    ]


def test_a_dangling_link_counts_in_the_fingerprint_and_in_the_rejected_records(tmp_path):
    corpus = tmp_path / "corpus"
    _write(corpus / "a.txt", "a document")
    before = fingerprint(corpus)
    (corpus / "b.txt").symlink_to(tmp_path / "missing.txt")
    assert fingerprint(corpus) != before  # the new rejected record changes raw_corpus's input version
    out = tmp_path / "raw"
    out.mkdir()
    stats = ingest(ReaderConfig(str(corpus)), out)
    assert (stats["files"], stats["documents"], stats["rejected"]) == (2, 1, 1)
    assert stats["rejected_by_file"] == {"b.txt": 1}
