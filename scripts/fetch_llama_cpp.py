"""Install llama.cpp's Python converter (convert_hf_to_gguf.py and its ``conversion`` package) and the
packages it pins into one folder, for largetrain_core.gguf_export and the transformers-4 tests.

llama.cpp's Python tools ship on the package registry inside the llama-cpp-python sdist
(``vendor/llama.cpp``); only those files are taken from it, nothing is compiled. The sdist is found
through the registry's JSON simple API (PEP 691) and checked against its pinned SHA-256. The
converter pins transformers 4.57.6 (its requirements-convert_hf_to_gguf.txt); that transformers, the
tokenizers and huggingface-hub it pins, and sentencepiece go into ``DEST/site`` with ``pip --target``
(no dependencies: torch, numpy, safetensors come from the virtualenv). The converter needs the ``gguf``
of its own tree (``gguf-py``, newer than the registry's release of the same version number).

Usage: python scripts/fetch_llama_cpp.py DEST
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
INDEX = os.environ.get("LARGETRAIN_PYPI_SIMPLE", "https://pypi.org/simple")
VENDOR = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
TAKE = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/", "LICENSE")
SITE = ["transformers==4.57.6", "tokenizers==0.22.2", "huggingface-hub==0.36.2", "sentencepiece==0.2.1"]


def main(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    req = urllib.request.Request(
        f"{INDEX}/llama-cpp-python/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        (entry,) = [f for f in json.load(r)["files"] if f["filename"] == SDIST]
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / SDIST
        with urllib.request.urlopen(entry["url"], timeout=600) as r, archive.open("wb") as f:
            shutil.copyfileobj(r, f)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SHA256:
            raise SystemExit(f"{entry['url']}: SHA-256 {digest}, expected {SHA256}")
        with tarfile.open(archive) as tar:
            members = [
                m for m in tar.getmembers() if m.name.startswith(VENDOR) and m.name[len(VENDOR) :].startswith(TAKE)
            ]
            for m in members:
                m.name = m.name[len(VENDOR) :]
            tar.extractall(dest, members=members, filter="data")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(dest / "site"), *SITE], check=True
    )
    print(f"llama.cpp's converter and transformers {SITE[0].split('==')[1]} in {dest}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
