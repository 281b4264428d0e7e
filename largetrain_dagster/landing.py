"""New data arriving: a landing directory, dynamic partitions, a sensor and declarative automation.

Files dropped into ``<storage root>/landing/<corpus>/`` (any reader format: txt/md/rst, JSONL(.gz),
Parquet; uploaders write under a dot-name or ``*.tmp``/``*.part`` and rename into place) become
partitions of the *landed* chain, one dynamic partition per landed file (a terabyte corpus arrives
as many files of a few GB, e.g. C4's 1,024 JSONL.gz shards, so a file is the natural batch):

    landed/raw_corpus [partition]  ->  landed/cleaned_text [partition]  ->  landed/deduplicated_text (global)

* ``landing_sensor`` adds a partition ``<corpus>/<file>`` per new file (both names percent-escaped,
  :func:`partition_key`: one key per file name, never two files under one key) and requests one run per
  partition (raw_corpus + cleaned_text). Its cursor remembers the files seen (name -> size and mtime);
  each run key is ``<partition>@<size>:<mtime_ns>``, so the same file never starts a second run, even
  if the cursor is lost, while a file replaced with new content does. A tick with nothing new skips
  with the reason.
* ``landed/cleaned_text`` and the global ``landed/deduplicated_text`` carry
  ``AutomationCondition.eager()``: when a partition is (re)materialized, the automation daemon
  updates what is downstream of it. ``landed/deduplicated_text`` reads every partition. The
  conditions are evaluated by ``landed_automation``, an automation condition sensor over the
  landed chain that is running by default (Dagster's implicit sensor starts stopped), so under
  ``dagster dev`` a landed file is read, cleaned and deduplicated without a click.
* The landed chain is a corpus chain like the roles' (largetrain_dagster.corpus.corpus_assets): the
  same stages, settings, executor, rejection check, accounting and near dedup; each partition is one
  file read whole.
* Training assets have no automation condition: they start only when asked (or by the schedule in
  ``largetrain_dagster.schedules``, stopped by default).

Artifacts: ``<root>/landed/<asset>/<partition>/<data version>/``; handles in
``<root>/_handles/landed/<asset>/<partition>.json``.
"""

import json
import re
from pathlib import Path

import xxhash

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    Failure,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from largetrain_core.readers import ReaderConfig
from largetrain_dagster.configs import dagster_config
from largetrain_dagster.corpus import Chain, corpus_assets
from largetrain_dagster.resources import Storage

landed_batches = DynamicPartitionsDefinition(name="landed_batches")
_PARTIAL = re.compile(r"(^\.)|(\.(tmp|part|partial)$)")


# A partition key part longer than this is cut and given a hash suffix (a path component may hold 255 bytes).
MAX_KEY_PART = 200


def escape_name(name: str) -> str:
    """``name`` as a partition key part: every character outside ``[A-Za-z0-9_-]`` and ``.`` is
    percent-encoded over its UTF-8 bytes (RFC 3986 style, ``%`` itself included), and so is a ``.``
    right after a ``.`` (Dagster refuses ``...`` in a key). Decoding gives the name back, so distinct
    names give distinct parts. A part longer than MAX_KEY_PART is cut to 180 characters plus ``~`` and
    the xxh3-64 of the exact name (``~`` is never left unescaped otherwise). Undecodable bytes of a
    file name (surrogate escapes) are encoded as the bytes they stand for."""
    out, prev = [], ""
    for ch in name:
        if (ch.isascii() and (ch.isalnum() or ch in "_-")) or (ch == "." and prev != "."):
            out.append(ch)
        else:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape")))
        prev = ch
    part = "".join(out)
    if len(part) <= MAX_KEY_PART:
        return part
    head = part[:180]
    head = head[: head.rfind("%")] if "%" in head[-2:] else head  # never end inside an escape
    return f"{head}~{xxhash.xxh3_64_hexdigest(name.encode('utf-8', 'surrogateescape'))}"


def partition_key(corpus: str, file_name: str) -> str:
    """``<corpus>/<file name>``, each escaped by :func:`escape_name` (injective: ``notes 1.md`` is
    ``notes%201.md``, ``notes_1.md`` stays ``notes_1.md``)."""
    return f"{escape_name(corpus)}/{escape_name(file_name)}"


def landed_files(landing: Path) -> dict[str, Path]:
    """Complete files under ``landing/<corpus>/`` (not recursing further), by partition key.

    Raises ValueError naming both files if two files get one key (only possible for names cut by
    :func:`escape_name` whose xxh3-64 collide): one file never silently shadows another."""
    out: dict[str, Path] = {}
    if landing.is_dir():
        for corpus_dir in sorted(p for p in landing.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for f in sorted(corpus_dir.iterdir()):
                if f.is_file() and not _PARTIAL.search(f.name):
                    key = partition_key(corpus_dir.name, f.name)
                    if key in out:
                        raise ValueError(
                            f"landed files {out[key]} and {f} map to one partition key {key!r}: rename one of them"
                        )
                    out[key] = f
    return out


def _landed_file(storage: Storage, pk: str, config) -> tuple[str, int, int]:
    """The landed file of partition ``pk``, read whole (partition 0 of 1)."""
    source = landed_files(storage.path("landing")).get(pk)
    if source is None:
        raise Failure(f"no landed file for partition {pk} under {storage.path('landing')}")
    return str(source), 0, 1


LANDED = Chain(
    "landed",
    "One landed file (<root>/landing/<corpus>/<file>)",
    landed_batches,
    _landed_file,
    raw_config=dagster_config(
        ReaderConfig, "LandedRawCorpusConfig", exclude=("path", "partition", "partitions", "id_prefix")
    ),
    hash_partitioned=False,
    automation=AutomationCondition.eager(),
)
LANDED_ASSETS = corpus_assets(LANDED)
# the per-file steps a landed file starts a run of
LANDED_FILE_STEPS = [AssetKey(["landed", "raw_corpus"]), AssetKey(["landed", "cleaned_text"])]


@sensor(
    name="landing_sensor",
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    asset_selection=LANDED_FILE_STEPS,
    description="New files under <storage root>/landing/<corpus>/ -> a dynamic partition each and one run per partition.",
)
def landing_sensor(context: SensorEvaluationContext, storage: Storage):
    """Cursor: JSON ``{partition key: "size:mtime_ns"}`` of the files already requested.

    Running by default: it only reads the landing directory, and data preparation is cheap and
    idempotent (a partition whose data version exists is reused)."""
    landing = storage.path("landing")
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    files = landed_files(landing)
    current = {k: f"{f.stat().st_size}:{f.stat().st_mtime_ns}" for k, f in files.items()}
    new = {k: v for k, v in current.items() if seen.get(k) != v}
    if not new:
        return SkipReason(f"no new files under {landing} ({len(current)} seen)")
    existing = set(context.instance.get_dynamic_partitions(landed_batches.name))
    to_add = sorted(k for k in new if k not in existing)
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"{k}@{v}",
                partition_key=k,
                asset_selection=LANDED_FILE_STEPS,
                tags={"largetrain/landed_file": str(files[k])},
            )
            for k, v in sorted(new.items())
        ],
        dynamic_partitions_requests=[landed_batches.build_add_request(to_add)] if to_add else [],
        cursor=json.dumps({**seen, **new}, sort_keys=True),
    )


landed_automation = AutomationConditionSensorDefinition(
    "landed_automation",
    target=AssetSelection.groups("landed_data"),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Evaluates the landed chain's automation conditions (eager: a cleaned partition updates the global "
    "dedup). Running by default, like landing_sensor: it only ever starts data preparation.",
)
