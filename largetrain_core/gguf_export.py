"""GGUF for local inference (llama.cpp, Ollama, LM Studio): a model export converted by llama.cpp's own
``convert_hf_to_gguf.py``.

The converter, its own ``gguf`` package and the packages it pins (transformers 4.57, tokenizers,
sentencepiece) live in ``<venv>/llama.cpp`` (the Makefile's ``$(VENV)/llama.cpp/.installed``:
``scripts/fetch_llama_cpp.py`` takes them from the llama-cpp-python sdist on the package registry,
where llama.cpp's Python tools ship). It runs in a child process with that folder first on
``sys.path``, so the project's transformers 5 never meets it.

The pre-tokenizer: the converter recognizes a BPE tokenizer by the hash of its ids on a fixed text
(``get_vocab_base_pre``) and knows only published models' tokenizers, so it refuses ours ("BPE
pre-tokenizer was not recognized"). A tokenizer this project trains is GPT-2's byte-level BPE (a
``ByteLevel`` pre-tokenizer with GPT-2's split pattern, no prefix space: largetrain_core.tokenizer.train_bpe),
which llama.cpp implements as the ``gpt-2`` pre-tokenizer; the child declares it so, after checking
tokenizer.json says so. Any other tokenizer (an imported model's) goes through the converter's own
recognition. ``tests/unit/test_gguf.py`` reloads the file in transformers (``gguf_file=``) and compares
the logits and the tokenizer's ids.

CLI: ``python -m largetrain_core.gguf_export MODEL_DIR OUT.gguf [--outtype f16|q8_0]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

OUTTYPES = ("f16", "q8_0", "f32", "bf16")  # the converter's --outtype choices we offer


def converter_dir() -> Path:
    """Where llama.cpp's converter is installed: ``$LARGETRAIN_LLAMA_CPP``, else ``<venv>/llama.cpp``."""
    return Path(os.environ.get("LARGETRAIN_LLAMA_CPP") or Path(sys.prefix) / "llama.cpp")


def is_gpt2_byte_level(tokenizer_json: Path) -> bool:
    """Whether ``tokenizer_json`` is a byte-level BPE whose pre-tokenizer is GPT-2's: a ``ByteLevel``
    pre-tokenizer with its regex and no prefix space, alone or as the only step of a sequence."""
    spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    return (
        (spec.get("model") or {}).get("type") == "BPE"
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
    )


def export_gguf(model_dir: str | Path, out: str | Path, outtype: str = "f16", timeout: float = 1800) -> Path:
    """Convert the Hugging Face model directory ``model_dir`` (config.json, safetensors, tokenizer: a
    ``base_checkpoint``'s ``model/`` or a ``lora_adapter``'s ``merged/``) to the GGUF file ``out``
    (``outtype``: f16, q8_0, f32 or bf16), written beside as a temporary file and renamed when whole.

    Raises FileNotFoundError when the converter is not installed (naming the make target), ValueError
    for an unknown ``outtype``, RuntimeError with the converter's last output lines when it fails."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: expected one of {', '.join(OUTTYPES)}")
    model_dir, out = Path(model_dir), Path(out)
    tool = converter_dir()
    if not (tool / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(
            f"{tool / 'convert_hf_to_gguf.py'}: llama.cpp's converter is not installed; `make install` puts it there "
            "(or set LARGETRAIN_LLAMA_CPP to a llama.cpp checkout with its Python requirements on the path)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}")
    gpt2 = (model_dir / "tokenizer.json").is_file() and is_gpt2_byte_level(model_dir / "tokenizer.json")
    paths = (tool / "site", tool, tool / "gguf-py")  # its pinned packages, itself, its own gguf
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}
    cmd = [sys.executable, "-m", "largetrain_core.gguf_export", "--child", str(model_dir), str(tmp), outtype]
    cmd += ["gpt-2"] if gpt2 else []
    env["PYTHONPATH"] += os.pathsep + str(Path(__file__).resolve().parent.parent)  # this package, last
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"llama.cpp's convert_hf_to_gguf.py failed on {model_dir} (exit {done.returncode}):\n{tail}")
    os.replace(tmp, out)
    return out


def _child(model_dir: str, out: str, outtype: str, pre: str | None) -> None:
    """In the converter's environment: declare the pre-tokenizer (module doc), then run its main()."""
    if pre:
        from conversion.base import TextModel

        TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", outtype]
    convert_hf_to_gguf.main()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        _child(argv[1], argv[2], argv[3], argv[4] if len(argv) > 4 else None)
        return 0
    parser = argparse.ArgumentParser(prog="python -m largetrain_core.gguf_export", description=__doc__.split("\n")[0])
    parser.add_argument(
        "model_dir", help="a Hugging Face model directory (base_checkpoint's model/, an adapter's merged/)"
    )
    parser.add_argument("out", help="the GGUF file to write")
    parser.add_argument("--outtype", default="f16", choices=OUTTYPES)
    args = parser.parse_args(argv)
    try:
        path = export_gguf(args.model_dir, args.out, args.outtype)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({path.stat().st_size:,} bytes, {args.outtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
