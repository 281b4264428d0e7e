"""Benchmark evaluation with EleutherAI's lm-evaluation-harness (``lm-eval``) on local task files.

* :func:`build_cloze_task` writes a multiple-choice cloze task from held-out documents (a JSONL file
  of items and the task's YAML): each item is the first half of a sentence, its own second half and
  the second halves of ``choices - 1`` other sentences, shuffled; the model should give its own
  second half the highest log-likelihood. Chance accuracy is 1 / ``choices``.
* :func:`build_chat_task` writes a generative task from held-out conversations: the prompt rendered through
  the chat template up to the last assistant turn, the model's greedy answer scored against the reference
  by exact match and token F1 (:func:`answer_scores`, SQuAD's normalization).
* :func:`check_task_files` reads task YAML files (lm-eval's task format) and refuses any whose data
  is not local: ``dataset_path`` must be one of datasets' packaged file builders
  (:data:`LOCAL_BUILDERS`) with ``dataset_kwargs.data_files`` naming files that exist (relative
  paths are taken from the YAML file's directory), or an existing local directory. Each is copied
  into the run's task directory with its data files made absolute.
* :func:`evaluate` runs the harness (``lm_eval.simple_evaluate``) with its Hugging Face model wrapper
  (``lm_eval.models.huggingface.HFLM``) on a model directory, and with a PEFT adapter through the
  wrapper's own ``peft`` argument, with Hugging Face's offline switches set (``HF_HUB_OFFLINE``,
  ``HF_DATASETS_OFFLINE``, ``TRANSFORMERS_OFFLINE``) and the datasets cache in a scratch directory:
  nothing is downloaded. Returns, per task, every metric with its standard error as the harness
  reports them (``acc``, ``acc_norm``: mean over items, stderr = sample standard deviation / sqrt(n)).

Multiple-choice scoring is lm-eval's: the log-likelihood of each choice as a continuation of the
context; ``acc`` takes the highest, ``acc_norm`` the highest per byte of the choice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np


# datasets' packaged builders that read local files (datasets.packaged_modules): nothing to download
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")


class TaskFileError(ValueError):
    """A task file that cannot be used; the message names the file, the key and why."""


def sentences(text: str, min_words: int, max_words: int) -> list[list[str]]:
    """The sentences of ``text`` (split after . ! ? ; : followed by white space, and at line breaks) with
    ``min_words`` to ``max_words`` whitespace-separated words, as word lists."""
    out = []
    for piece in SENTENCE_END.split(text):
        words = piece.split()
        if min_words <= len(words) <= max_words:
            out.append(words)
    return out


def build_cloze_task(
    documents: Iterable[tuple[str, str]],
    out_dir: Path,
    name: str,
    items: int = 200,
    choices: int = 4,
    min_words: int = 8,
    max_words: int = 40,
    seed: int = 0,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
) -> dict:
    """Write ``out_dir/<name>.jsonl`` and ``out_dir/<name>.yaml``: a multiple-choice cloze task of at most
    ``items`` items from the sentences of ``documents`` ((doc_id, text) pairs, in a stable order).

    Each item: ``context`` = the sentence's first ⌊n/2⌋ words, ``choices`` = its remaining words and
    the remaining words of ``choices - 1`` other sentences (distinct texts), each with a leading space,
    in a seeded random order; ``label`` = the index of its own; ``doc_id`` and ``sentence`` say where
    it came from. Sentences are drawn without replacement by numpy PCG64(``seed``). With
    ``count_tokens`` (the evaluated model's tokenizer: text -> token count) and ``max_tokens`` (its
    context length), a sentence of more than ``max_tokens`` tokens is not used: lm-eval's HFLM
    refuses a continuation longer than the context (an assertion), and a context longer than it is
    cut from the left. Returns ``{"task", "yaml", "data", "items", "sentences", "documents", "choices",
    "chance", "too_long"}`` (too_long: sentences left out for their token count). Raises
    ValueError when fewer than ``choices`` usable sentences exist (naming the counts)."""
    if choices < 2 or items < 1 or min_words < 2:
        raise ValueError(f"need choices >= 2, items >= 1, min_words >= 2; got {choices}, {items}, {min_words}")
    pool, docs, too_long = _sentence_pool(documents, min_words, max_words, count_tokens, max_tokens)
    if len(pool) < choices:
        raise ValueError(
            f"{docs} held-out document(s) hold {len(pool)} sentence(s) of {min_words} to {max_words} "
            f"words{f' and at most {max_tokens} tokens ({too_long} longer)' if too_long else ''}, fewer "
            f"than the {choices} choices an item needs: lower min_words or hold out more "
            "documents (validation_fraction)"
        )
    rows = _cloze_items(pool, items, choices, seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    yaml_file = out_dir / f"{name}.yaml"
    yaml_file.write_text(cloze_yaml(name, data))
    return {
        "task": name,
        "yaml": str(yaml_file),
        "data": str(data),
        "items": len(rows),
        "sentences": len(pool),
        "documents": docs,
        "choices": choices,
        "chance": 1 / choices,
        "too_long": too_long,
    }


def _sentence_pool(
    documents: Iterable[tuple[str, str]],
    min_words: int,
    max_words: int,
    count_tokens: Callable[[str], int] | None,
    max_tokens: int | None,
) -> tuple[list[tuple[str, int, list[str]]], int, int]:
    """The usable sentences of ``documents`` as (doc_id, sentence index, words), the documents read and
    the sentences left out for their token count (see :func:`build_cloze_task`)."""
    pool, docs, too_long = [], 0, 0
    for doc_id, text in documents:
        docs += 1
        for i, words in enumerate(sentences(text, min_words, max_words)):
            if count_tokens is not None and max_tokens is not None and count_tokens(" ".join(words)) > max_tokens:
                too_long += 1
                continue
            pool.append((doc_id, i, words))
    return pool, docs, too_long


def _cloze_items(pool: list[tuple[str, int, list[str]]], items: int, choices: int, seed: int) -> list[dict]:
    """At most ``items`` cloze items drawn from the sentence ``pool`` by PCG64(``seed``) (see :func:`build_cloze_task`)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    rows = []
    for k in order[:items]:
        doc_id, i, words = pool[k]
        cut = len(words) // 2
        answer = " " + " ".join(words[cut:])
        others = []
        for j in rng.permutation(len(pool)):
            ow = pool[j][2]
            cand = " " + " ".join(ow[len(ow) // 2 :])
            if cand != answer and cand not in others:
                others.append(cand)
            if len(others) == choices - 1:
                break
        if len(others) < choices - 1:
            continue  # too few distinct endings (a corpus of near-identical sentences)
        opts = [answer, *others]
        perm = rng.permutation(choices)
        rows.append(
            {
                "context": " ".join(words[:cut]),
                "choices": [opts[p] for p in perm],
                "label": int(np.flatnonzero(perm == 0)[0]),
                "doc_id": doc_id,
                "sentence": i,
            }
        )
    return rows


def cloze_yaml(name: str, data: Path) -> str:
    """The lm-eval task YAML of a cloze JSONL file (fields context, choices, label). An absolute (or
    resolvable) ``data`` is written absolute, as lm-eval reads it; a bare file name is written as it is, a
    file beside the YAML (:func:`check_task_files` reads such a task again)."""
    return (
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {json.dumps(str(data) if Path(data).name == str(data) else str(Path(data).resolve()))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\n'
        "metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1\n"
    )


ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
CHAT_METRICS = "chat_metrics"  # the Python module beside a chat task's YAML (lm-eval's !function)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's answer normalization (Rajpurkar et al. 2016, its official evaluate-v1.1.py): lower case,
    ASCII punctuation removed, the articles a / an / the removed, white space collapsed."""
    text = "".join(c for c in text.lower() if c not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def answer_scores(prediction: str, reference: str) -> dict[str, float]:
    """``{"exact_match", "token_f1"}`` of a generated answer against the reference, both
    :func:`normalize_answer`-ed (SQuAD v1.1's metrics): exact_match 1.0 when equal, else 0.0; token_f1 the
    harmonic mean of the precision and recall of the prediction's tokens (white-space split) over the
    reference's, counting repeats (a multiset overlap); 1.0 when both are empty, 0.0 when one is."""
    from collections import Counter

    p, r = normalize_answer(prediction).split(), normalize_answer(reference).split()
    exact = float(p == r)
    if not p or not r:
        return {"exact_match": exact, "token_f1": float(p == r)}
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return {"exact_match": exact, "token_f1": 0.0}
    precision, recall = common / len(p), common / len(r)
    return {"exact_match": exact, "token_f1": 2 * precision * recall / (precision + recall)}


def chat_process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval's ``process_results`` of a chat task (:func:`build_chat_task`): the generation ``results[0]``
    scored against ``doc["answer"]`` (:func:`answer_scores`)."""
    return answer_scores(results[0], doc["answer"])


def build_chat_task(
    conversations: Iterable[tuple[str, list[dict]]],
    out_dir: Path,
    name: str,
    render_prompt: Callable[[list[dict]], str],
    stop: list[str],
    items: int = 100,
    max_gen_toks: int = 64,
    seed: int = 0,
) -> dict:
    """Write ``out_dir/<name>.jsonl``, ``out_dir/<name>.yaml`` and ``out_dir/chat_metrics.py``: a generative
    lm-eval task (``output_type: generate_until``, greedy) of at most ``items`` held-out conversations
    ((doc_id, messages) pairs, largetrain_core.chat's messages), drawn without replacement by numpy
    PCG64(``seed``). Each item: ``prompt``, ``render_prompt`` of the messages before the conversation's last
    assistant message (the chat template with its generation prompt:
    ``lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)``), ``answer``, that
    message's content, and ``doc_id``. The model generates until one of ``stop`` (the template's end of
    turn, e.g. ``<|im_end|>``) or ``max_gen_toks`` tokens; scored per item by :func:`chat_process_results`
    (exact_match and token_f1, means over the items). A conversation without an assistant message with
    content, or whose prompt would be empty, is not used (counted in ``skipped``). Returns ``{"task",
    "items", "conversations", "skipped", "data", "yaml"}``. Raises ValueError when no conversation is usable."""
    pool, skipped = [], 0
    for doc_id, messages in conversations:
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        answer = messages[last].get("content") if last is not None else None
        if last is None or last == 0 or not isinstance(answer, str) or not answer.strip():
            skipped += 1
            continue
        pool.append({"doc_id": doc_id, "prompt": render_prompt(list(messages[:last])), "answer": answer})
    if not pool:
        raise ValueError(f"no conversation with a prompt and an assistant answer ({skipped} without)")
    rng = np.random.default_rng(seed)
    chosen = [pool[i] for i in sorted(rng.choice(len(pool), size=min(items, len(pool)), replace=False))]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chosen))
    (out_dir / f"{CHAT_METRICS}.py").write_text(
        "from largetrain_core.harness import chat_process_results as process_results  # noqa: F401\n"
    )
    yaml_file = out_dir / f"{name}.yaml"
    yaml_file.write_text(chat_yaml(name, data, stop, max_gen_toks))
    return {
        "task": name,
        "items": len(chosen),
        "conversations": len(pool) + skipped,
        "skipped": skipped,
        "data": str(data),
        "yaml": str(yaml_file),
    }


def chat_yaml(name: str, data: Path, stop: list[str], max_gen_toks: int) -> str:
    """The lm-eval task YAML of a chat JSONL file (fields prompt, answer): ``generate_until`` one of ``stop``
    or ``max_gen_toks`` tokens, greedy, scored by :func:`chat_process_results` (exact_match, token_f1).
    ``data`` is written as :func:`cloze_yaml` writes it (a bare file name: the file beside the YAML)."""
    return (
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {json.dumps(str(data) if Path(data).name == str(data) else str(Path(data).resolve()))}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        f"  until: {json.dumps(list(stop))}\n"
        "  do_sample: false\n"
        f"  max_gen_toks: {int(max_gen_toks)}\n"
        f"process_results: !function {CHAT_METRICS}.process_results\n"
        "metric_list:\n"
        "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: token_f1\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1\n"
    )


class _TaskLoader:
    """A YAML loader that keeps lm-eval's ``!function`` tags as text (they name Python in the task's
    directory, which the harness itself loads)."""

    @staticmethod
    def load(path: Path) -> dict:
        import yaml

        class Loader(yaml.SafeLoader):
            pass

        Loader.add_multi_constructor("!", lambda loader, suffix, node: f"!{suffix} {loader.construct_scalar(node)}")
        with open(path) as f:
            return yaml.load(f, Loader=Loader)


def check_task_files(paths: Iterable[str | Path], out_dir: Path) -> list[str]:
    """Check every lm-eval task YAML in ``paths`` (files, or directories searched for ``*.yaml``) for local
    data (module docstring) and copy it into ``out_dir`` with its data files made absolute (a task's
    ``!function`` Python files beside it are copied too). Returns the task names. Raises TaskFileError
    naming the file, the key and the reason: unreadable YAML, no ``task`` name, a name given twice, a
    ``dataset_path`` that is neither a local builder nor a local directory (a hub data set would be
    downloaded), a missing data file."""
    import yaml

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.yaml"))
        elif p.exists():
            files.append(p)
        else:
            raise TaskFileError(f"{p}: no such task file or directory")
    names = []
    for f in files:
        try:
            task = _TaskLoader.load(f)
        except (OSError, yaml.YAMLError) as e:
            raise TaskFileError(f"{f}: not a readable task YAML ({type(e).__name__}: {e})") from e
        if not isinstance(task, dict) or not isinstance(task.get("task"), str):
            raise TaskFileError(f"{f}: key 'task' (the task's name) is missing; an lm-eval task file names its task")
        if "include" in task:
            raise TaskFileError(f"{f}: key 'include' is not supported here: write the task in one file")
        name = task["task"]
        if name in names:
            raise TaskFileError(f"{f}: task {name!r} is defined twice among {', '.join(map(str, paths))}")
        source = task.get("dataset_path")
        kwargs = dict(task.get("dataset_kwargs") or {})
        if source in LOCAL_BUILDERS:
            data_files = kwargs.get("data_files")
            if not data_files:
                raise TaskFileError(f"{f}: dataset_path {source!r} needs dataset_kwargs.data_files (local files)")
            kwargs["data_files"] = _absolute_files(data_files, f)
        elif source and Path(f.parent, source).is_dir():
            task["dataset_path"] = str(Path(f.parent, source).resolve())
        else:
            raise TaskFileError(
                f"{f}: dataset_path {source!r} is not local data: nothing is downloaded at run time. Use "
                f"dataset_path: one of {', '.join(LOCAL_BUILDERS)} with dataset_kwargs.data_files naming local files, "
                "or a local dataset directory"
            )
        if kwargs:
            task["dataset_kwargs"] = kwargs
        for fn in {v.split()[1].split(".")[0] for v in _strings(task) if v.startswith("!function ")}:
            src = f.parent / f"{fn}.py"
            if not src.exists():
                raise TaskFileError(f"{f}: !function names {fn}.py, which is not beside the task file")
            shutil.copy2(src, out_dir / src.name)
        (out_dir / f"{name}.yaml").write_text(_dump(task))
        names.append(name)
    return names


def task_digest(paths) -> str:
    """One xxh3-128 digest of the task files in ``paths`` as :func:`check_task_files` would use them: each
    task YAML's text and the bytes of every data file it names. Raises TaskFileError as check_task_files."""
    import xxhash

    from largetrain_core.digest import file_digest

    h = xxhash.xxh3_128()
    with tempfile.TemporaryDirectory() as tmp:
        for name in check_task_files(paths, Path(tmp)):
            text = (Path(tmp) / f"{name}.yaml").read_text()
            h.update(text.encode())
            for value in _strings(_TaskLoader.load(Path(tmp) / f"{name}.yaml").get("dataset_kwargs") or {}):
                if Path(value).is_file():
                    h.update(file_digest(Path(value)).encode())
    return h.hexdigest()


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _dump(task: dict) -> str:
    """YAML text of ``task``, with the ``!function`` values written back as tags."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def strings(dumper, value):
        if value.startswith("!function "):
            return dumper.represent_scalar("!function", value.split(" ", 1)[1])
        return dumper.represent_str(value)

    Dumper.add_representer(str, strings)
    return yaml.dump(task, Dumper=Dumper, sort_keys=False, allow_unicode=True)


def _absolute_files(data_files, task_file: Path):
    """``data_files`` (a path, a list, or split -> path(s)) with every path absolute and checked to exist."""

    def one(p):
        path = Path(p) if Path(p).is_absolute() else task_file.parent / p
        if not path.exists():
            raise TaskFileError(
                f"{task_file}: dataset_kwargs.data_files names {p}, which does not exist (looked at {path})"
            )
        return str(path.resolve())

    if isinstance(data_files, dict):
        return {k: _absolute_files(v, task_file) for k, v in data_files.items()}
    if isinstance(data_files, list):
        return [one(p) for p in data_files]
    return one(data_files)


@contextlib.contextmanager
def offline(cache_dir: Path):
    """Hugging Face's offline switches and a scratch datasets cache, restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*OFFLINE, "HF_DATASETS_CACHE")}
    os.environ.update(OFFLINE)
    os.environ["HF_DATASETS_CACHE"] = str(cache_dir)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def evaluate(
    model_dir: Path,
    task_dir: Path,
    tasks: list[str],
    adapter_dir: Path | None = None,
    *,
    batch_size: int = 8,
    device: str = "cpu",
    limit: int | None = None,
    samples_file: Path | None = None,
    bootstrap_iters: int = 100000,
    seed: int = 0,
) -> dict:
    """Run lm-eval's ``simple_evaluate`` on ``tasks`` (task YAML files in ``task_dir``, as
    :func:`check_task_files` or :func:`build_cloze_task` wrote them) with ``HFLM`` on the Hugging Face
    directory ``model_dir`` (fp32, ``device``), plus the PEFT adapter ``adapter_dir`` through HFLM's
    ``peft`` argument. ``limit``: at most that many items per task. ``samples_file``: every item's
    log-likelihoods and metrics as JSON lines.

    Returns ``{"tasks": {task: {"items": n, "metrics": {metric: {"value", "stderr"}}}}, "lm_eval_version",
    "model", "adapter"}``; metrics as the harness names them (``acc``, ``acc_norm``; its filter suffix
    ``,none`` dropped). Raises FileNotFoundError naming a missing model or adapter directory."""
    import lm_eval

    for d, what in ((model_dir, "model"), (adapter_dir, "adapter")):
        if d is not None and not Path(d).is_dir():
            raise FileNotFoundError(f"{d}: no such {what} directory to evaluate")
    raw = _simple_evaluate(
        model_dir,
        task_dir,
        tasks,
        adapter_dir,
        batch_size,
        device,
        limit,
        samples_file is not None,
        bootstrap_iters,
        seed,
    )
    out = {
        "tasks": {},
        "lm_eval_version": getattr(lm_eval, "__version__", None),
        "model": str(model_dir),
        "adapter": str(adapter_dir) if adapter_dir else None,
    }
    for task, values in raw["results"].items():
        items = (raw.get("n-samples") or {}).get(task, {}).get("effective")
        out["tasks"][task] = {"items": items, "metrics": _task_metrics(values)}
    if samples_file is not None:
        _write_samples(samples_file, raw.get("samples", {}))
    return out


def _simple_evaluate(
    model_dir: Path,
    task_dir: Path,
    tasks: list[str],
    adapter_dir: Path | None,
    batch_size: int,
    device: str,
    limit: int | None,
    log_samples: bool,
    bootstrap_iters: int,
    seed: int,
) -> dict:
    """lm-eval's ``simple_evaluate`` results of HFLM (fp32) on ``model_dir`` (+ ``adapter_dir``), offline."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="lm-eval-cache-") as cache, offline(Path(cache)):
        lm = HFLM(
            pretrained=str(model_dir),
            peft=str(adapter_dir) if adapter_dir else None,
            device=device,
            dtype="float32",
            batch_size=batch_size,
        )
        manager = TaskManager(include_path=str(task_dir), include_defaults=False)
        raw = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            log_samples=log_samples,
            bootstrap_iters=bootstrap_iters,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    return raw


def _task_metrics(values: dict) -> dict[str, dict]:
    """One task's results from lm-eval (``metric,filter`` keys) as ``{metric: {"value", "stderr"}}``,
    the filter ``none`` dropped from the name."""
    metrics = {}
    for key, value in values.items():
        metric, _, filt = key.partition(",")
        if not filt or metric.endswith("_stderr") or not isinstance(value, (int, float)):
            continue
        stderr = values.get(f"{metric}_stderr,{filt}")
        name = metric if filt == "none" else f"{metric}_{filt}"
        metrics[name] = {
            "value": float(value),
            "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
        }
    return metrics


def _write_samples(samples_file: Path, samples: dict) -> None:
    """Every item's generations or log-likelihoods and metrics (lm-eval's ``samples``) as JSON lines."""
    Path(samples_file).parent.mkdir(parents=True, exist_ok=True)
    with open(samples_file, "w") as f:
        for task, rows in samples.items():
            for r in rows:
                f.write(
                    json.dumps(
                        {
                            "task": task,
                            "doc_id": r["doc_id"],
                            "target": r["target"],
                            **(
                                {"generations": list(r["filtered_resps"])}
                                if all(isinstance(x, str) for x in r["filtered_resps"])
                                else {"loglikelihoods": [x[0] for x in r["filtered_resps"]]}
                            ),
                            **{m: r[m] for m in values_of(r)},
                        },
                        default=str,
                    )
                    + "\n"
                )


def values_of(sample: dict) -> list[str]:
    """The per-item metric keys of an lm-eval sample record (acc, acc_norm, ...)."""
    fixed = {
        "doc_id",
        "doc",
        "target",
        "arguments",
        "resps",
        "filtered_resps",
        "filter",
        "metrics",
        "doc_hash",
        "prompt_hash",
        "target_hash",
    }
    return [k for k in sample if k not in fixed and isinstance(sample[k], (int, float))]


def results_table(results: dict[str, dict]) -> str:
    """Markdown: one row per task and metric, one column per evaluated model (``results``: label -> the
    dict :func:`evaluate` returned), each value ± its standard error."""
    labels = list(results)
    keys = []
    for r in results.values():
        for task, t in r["tasks"].items():
            for metric in t["metrics"]:
                if (task, metric) not in keys:
                    keys.append((task, metric))

    def cell(label, task, metric):
        m = results[label]["tasks"].get(task, {}).get("metrics", {}).get(metric)
        if m is None:
            return ""
        return f"{m['value']:.4f}" + ("" if m["stderr"] is None else f" ± {m['stderr']:.4f}")

    head = "| task | metric | items | " + " | ".join(labels) + " |\n|---|---|---|" + "---|" * len(labels) + "\n"
    rows = [
        f"| {task} | {metric} | {next((r['tasks'][task]['items'] for r in results.values() if task in r['tasks']), '')} | "
        + " | ".join(cell(label, task, metric) for label in labels)
        + " |"
        for task, metric in keys
    ]
    return head + "\n".join(rows)


def flat_metrics(results: dict, prefix: str) -> dict:
    """``{"<prefix>/<task>/<metric>": value, ".../<metric>_stderr": stderr}`` for trackers and Dagster metadata."""
    out = {}
    for task, t in results["tasks"].items():
        for metric, m in t["metrics"].items():
            out[f"{prefix}/{task}/{metric}"] = m["value"]
            if m["stderr"] is not None:
                out[f"{prefix}/{task}/{metric}_stderr"] = m["stderr"]
    return out


@dataclass(frozen=True)
class BenchmarkSettings:
    """lm-evaluation-harness tasks run by ``evaluation`` on the base and on base + adapter."""

    tasks: tuple[str, ...] = field(
        default=(),
        metadata={
            "description": (
                "Local lm-eval task files (YAML) or directories of them; each task's data must be local files "
                f"(dataset_path one of {', '.join(LOCAL_BUILDERS)} with dataset_kwargs.data_files, relative to the YAML file): "
                "nothing is downloaded."
            )
        },
    )
    cloze_items: int = field(
        default=200,
        metadata={
            "description": (
                "Items of the built-in task domain_cloze, a multiple-choice cloze over sentences of the held-out domain "
                "documents (the domain shards' validation split): the first half of a sentence, its own second half against "
                "those of other sentences. 0 = no built-in task."
            )
        },
    )
    cloze_choices: int = field(default=4, metadata={"description": "Choices per cloze item (chance = 1 / choices)."})
    cloze_min_words: int = field(default=8, metadata={"description": "Fewest words of a sentence used for the cloze."})
    cloze_max_words: int = field(default=40, metadata={"description": "Most words of a sentence used for the cloze."})
    batch_size: int = field(default=8, metadata={"description": "lm-eval's batch size (requests per forward pass)."})
    limit: Optional[int] = field(
        default=None, metadata={"description": ("At most this many items per task (lm-eval's --limit); null = all.")}
    )
    seed: int = field(default=0, metadata={"description": "Seed of the cloze items' draw and of lm-eval's seeds."})

    def problems(self) -> list[str]:
        p = []
        if (
            self.cloze_items < 0
            or self.cloze_choices < 2
            or self.cloze_min_words < 2
            or self.cloze_max_words < self.cloze_min_words
        ):
            p.append(
                "benchmark: cloze_items >= 0, cloze_choices >= 2 and 2 <= cloze_min_words <= cloze_max_words, not "
                f"{self.cloze_items}, {self.cloze_choices}, {self.cloze_min_words}, {self.cloze_max_words}"
            )
        if self.batch_size < 1 or (self.limit is not None and self.limit < 1):
            p.append(f"benchmark: batch_size >= 1 and limit null or >= 1, not {self.batch_size} and {self.limit}")
        return p


CLOZE_TASK = "domain_cloze"
POOL_PER_ITEM = 20  # the cloze reads held-out documents until it has this many sentences per item (bounded memory)


def held_out_documents(text_dirs, manifest: dict, batch_documents: int = 512):
    """(doc_id, text) of every document of the ``part-*.parquet`` files under ``text_dirs`` that the token
    shards of ``manifest`` put in their validation split (largetrain_core.shards.split_of with the
    manifest's validation_fraction and seed), in part-file order."""
    import polars as pl

    from largetrain_core.shards import split_of
    from largetrain_core.storage import part_files

    fraction, seed = manifest.get("validation_fraction", 0.0), manifest.get("seed", 0)
    for part in part_files(text_dirs):
        for batch in pl.read_parquet(part, columns=["doc_id", "text"]).iter_slices(batch_documents):
            ids = batch["doc_id"].to_list()
            for doc_id, text, held in zip(ids, batch["text"].to_list(), split_of(ids, fraction, seed)):
                if held:
                    yield doc_id, text


def context_of(model_dir: Path) -> tuple[Callable[[str], int], int]:
    """(text -> token count with the model's tokenizer, the model's context length in tokens) of the
    Hugging Face directory ``model_dir``, the length as HFLM takes it: the config's
    ``max_position_embeddings`` (or ``n_positions``), else the tokenizer's ``model_max_length``, else 2048."""
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    config = AutoConfig.from_pretrained(str(model_dir))
    length = next(
        (getattr(config, a) for a in ("max_position_embeddings", "n_positions", "n_ctx") if getattr(config, a, None)),
        None,
    )
    if length is None:
        length = tok.model_max_length if tok.model_max_length < 10**9 else 2048
    return (lambda text: len(tok(text, add_special_tokens=False)["input_ids"])), int(length)


def _cloze(
    settings: BenchmarkSettings, task_dir: Path, held_out, models: dict[str, tuple[Path, Path | None]]
) -> tuple[dict | None, str | None]:
    """The cloze task built from ``held_out`` into ``task_dir`` (its record, None) or, with too few
    held-out sentences, (None, why it is skipped)."""
    pool_target = POOL_PER_ITEM * settings.cloze_items

    def bounded(docs):
        seen = 0
        for doc_id, text in docs:
            yield doc_id, text
            seen += len(sentences(text, settings.cloze_min_words, settings.cloze_max_words))
            if seen >= pool_target:
                return

    count_tokens, max_tokens = context_of(next(iter(models.values()))[0])
    try:
        cloze = build_cloze_task(
            bounded(held_out),
            task_dir,
            CLOZE_TASK,
            settings.cloze_items,
            settings.cloze_choices,
            settings.cloze_min_words,
            settings.cloze_max_words,
            settings.seed,
            count_tokens,
            max_tokens,
        )
    except ValueError as e:  # too few held-out sentences: the cloze is skipped, said, never silently
        return None, f"no {CLOZE_TASK} task: {e}"
    return cloze, None


def run_benchmarks(
    settings: BenchmarkSettings,
    models: dict[str, tuple[Path, Path | None]],
    out: Path,
    held_out=None,
    device: str | None = None,
) -> dict:
    """Run every task of ``settings`` on each of ``models`` (label -> (model directory, adapter directory or
    None)) into ``out``: ``tasks/`` (the checked task files and the built cloze, its YAML naming its data
    file beside it), ``benchmark.json``
    (``{"tasks": [...], "cloze": build_cloze_task's record or None, "results": {label: evaluate's dict}}``)
    and ``samples-<label>.jsonl``. ``held_out``: (doc_id, text) pairs for the cloze (read until it has
    :data:`POOL_PER_ITEM` sentences per item). Returns benchmark.json's dict. Raises ValueError for bad
    settings or no task at all, TaskFileError for a task file that cannot be used."""
    import torch

    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    out = Path(out)
    task_dir = out / "tasks"
    names = check_task_files(settings.tasks, task_dir)
    cloze, skipped = (
        _cloze(settings, task_dir, held_out, models) if settings.cloze_items and held_out is not None else (None, None)
    )
    if cloze:
        names = [CLOZE_TASK, *names]
    if not names:
        if skipped:
            record = {"tasks": [], "cloze": None, "results": {}, "skipped": skipped}
            (out / "benchmark.json").write_text(json.dumps(record, indent=1))
            return record
        raise ValueError("benchmark: no task to run (cloze_items 0 and no tasks)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    results = {
        label: evaluate(
            model_dir,
            task_dir,
            names,
            adapter,
            batch_size=settings.batch_size,
            device=device,
            limit=settings.limit,
            samples_file=out / f"samples-{label}.jsonl",
            seed=settings.seed,
        )
        for label, (model_dir, adapter) in models.items()
    }
    if cloze:  # the committed task and record name the cloze's files by their place in ``out``, not the build's
        (task_dir / f"{CLOZE_TASK}.yaml").write_text(cloze_yaml(CLOZE_TASK, Path(f"{CLOZE_TASK}.jsonl")))
        cloze = {**cloze, "yaml": f"tasks/{CLOZE_TASK}.yaml", "data": f"tasks/{CLOZE_TASK}.jsonl"}
    record = {"tasks": names, "cloze": cloze, "results": results, "skipped": skipped}
    (out / "benchmark.json").write_text(json.dumps(record, indent=1))
    return record


def write_benchmark_card(model_dir: Path, results: dict, out_dir: Path, model_name: str) -> Path:
    """``out_dir/README.md``: the model card of ``model_dir`` (its README.md, as the training wrote it) with
    the benchmark ``results`` (:func:`evaluate`'s dict) added: in the card's metadata as Hugging Face
    ``model-index`` results (huggingface_hub EvalResult: task, data set, metric, value, stderr in the
    metric's name) and as a section of text. The model directory itself is left as it is (another
    asset's artifact); returns the card's path."""
    from huggingface_hub import EvalResult, ModelCard

    src = Path(model_dir) / "README.md"
    card = ModelCard(src.read_text() if src.exists() else "---\n---\n", ignore_metadata_errors=True)
    evals = []
    for task, t in results["tasks"].items():
        for metric, m in t["metrics"].items():
            evals.append(
                EvalResult(
                    task_type="multiple-choice",
                    task_name=task,
                    dataset_type=task,
                    dataset_name=task,
                    metric_type=metric,
                    metric_value=round(m["value"], 4),
                    metric_name=f"{metric} (stderr {m['stderr']:.4f})" if m["stderr"] is not None else metric,
                    source_name="lm-evaluation-harness",
                    source_url="https://github.com/EleutherAI/lm-evaluation-harness",
                )
            )
    card.data.eval_results = evals
    card.data.model_name = model_name
    section = [
        "",
        "## Benchmarks (lm-evaluation-harness)",
        "",
        f"Scored by lm-eval {results.get('lm_eval_version')} (HFLM{', PEFT adapter' if results.get('adapter') else ''}) "
        "on local task files; value ± standard error (sample standard deviation / sqrt(items)).",
        "",
        results_table({model_name: results}),
        "",
    ]
    card.text = card.text.rstrip() + "\n" + "\n".join(section)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    card.save(str(out_dir / "README.md"))
    return out_dir / "README.md"
