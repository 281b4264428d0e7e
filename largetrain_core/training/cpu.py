"""This host's CPU as Linux describes it in /proc/cpuinfo: one reader for the peak FLOP/s derivation
(``flops.cpu_peak_flops``), the bf16 check and the device name of the measurements (``ablation``) and
the flags DeepSpeed's op builders compile for (``distributed.cpu_info``)."""

from __future__ import annotations

from pathlib import Path


def cpu_fields(text: str | None = None) -> dict[str, str]:
    """The first processor's fields, name -> value as written (``"model name"``, ``"vendor_id"``,
    ``"cpu MHz"``, ``"flags"``: space-separated), from ``text`` (default: /proc/cpuinfo). The first block
    is enough: the cores of one x86 host share their model and flags. {} where the file cannot be read
    (not Linux)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the blank line after the first processor's block
            continue
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(text: str | None = None) -> set[str]:
    """The first processor's flags (``avx2``, ``avx512f``, ``amx_bf16`` ...); empty where unknown."""
    return set(cpu_fields(text).get("flags", "").split())
