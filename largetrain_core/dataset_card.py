"""The README.md a version directory of a data asset carries, so that a directory-level read gives its
documents or sequences and nothing else.

A version directory holds its data files beside bookkeeping (``_manifest.json``, ``stats.json``,
``filtered.parquet``, ``duplicates.parquet``, ``signatures/``). Hugging Face ``datasets`` reads the
``configs`` block of a README.md's YAML front matter (the dataset-card convention:
https://huggingface.co/docs/hub/datasets-manual-configuration) as the list of data files per split,
so ``load_dataset(<version dir>)`` reads exactly those files, in that order. The text assets list
``part-*.parquet`` (columns ``doc_id``, ``source``, ``text``, ...); the token shards list the manifest's
shard files of each split in training order (paths relative to the directory, ``../`` included where
the global step refers to its partitions' files). Tools that take a glob read the same files:
polars ``pl.scan_parquet(f"{dir}/part-*.parquet")``, DuckDB ``read_parquet('DIR/part-*.parquet')``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CARD = "README.md"
TEXT_FILES = {"train": ["part-*.parquet"]}  # every text asset's documents: one split, named as datasets names it


def write(out_dir: Path, asset: str, data_files: dict[str, list[str]], description: str) -> Path:
    """Write ``out_dir/README.md``: YAML front matter with one ``default`` config whose ``data_files``
    are ``data_files`` (split name -> paths or globs relative to ``out_dir``), then ``description``
    under the asset's name. Returns the file's path."""
    config = {"config_name": "default", "data_files": [{"split": s, "path": list(p)} for s, p in data_files.items()]}
    front = yaml.safe_dump({"configs": [config]}, sort_keys=False)
    path = Path(out_dir) / CARD
    path.write_text(f"---\n{front}---\n\n# {asset}\n\n{description.strip()}\n", encoding="utf-8")
    return path


TEXT_DESCRIPTION = """\
Documents, one row each, in `part-*.parquet` (columns `doc_id`, `source`, `text`, and the corpus's
extra columns). The other files are the step's bookkeeping (`stats.json`, `_manifest.json`, the
removed documents with their reasons). Read the documents with:

```python
from datasets import load_dataset
docs = load_dataset("THIS_DIRECTORY", split="train")  # the part files only, as this card lists them
```
or `polars.scan_parquet("THIS_DIRECTORY/part-*.parquet")`, or DuckDB's `read_parquet('THIS_DIRECTORY/part-*.parquet')`.
"""

SHARDS_DESCRIPTION = """\
Packed token windows of `seq_len + 1` ids (column `input_ids`), uncompressed Arrow IPC files, in the
order `manifest.json` lists them per split. `load_dataset("THIS_DIRECTORY")` reads them as the splits
`train` and `validation` (it copies them into its cache); largetrain reads them in place
(`largetrain_core.shards.TokenShards`). `tokenizer.json` and `tokenizer_config.json` are the tokenizer
that made them.
"""
