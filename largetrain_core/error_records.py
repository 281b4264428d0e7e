"""Each training rank's error record, and the message and retry decision of a failed torchrun.

Error records use what torch's elastic launcher offers: torchrun (``--log-dir DIR``) gives every rank
the path of its error file in ``TORCHELASTIC_ERROR_FILE``
(``DIR/<run id>_<random>/attempt_<n>/<local rank>/error.json``); the entry point, wrapped by
:func:`record` (torch's ``torch.distributed.elastic.multiprocessing.errors.record`` with
``RankErrorHandler``), writes its uncaught exception there in torch's JSON format, plus a
``largetrain`` record: the exception's full type name, message, global rank, the file it concerns,
and whether it is *transient*. :func:`rank_errors` reads them back and :func:`describe_failure`
turns them into the message a user sees and the decision whether to retry.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import traceback
from pathlib import Path

from largetrain_core import rank_signals
from largetrain_core.processes import exit_status

AGENT_ERROR_FILE = "torchrun-error.json"  # the torchrun agent's own TORCHELASTIC_ERROR_FILE, inside log_dir


@contextlib.contextmanager
def concerning(path: str | Path, doing: str, hint: str | None = None):
    """Mark an exception raised in the block as concerning ``path``: its error record names the file,
    and a note (PEP 678) says ``while <doing> <path>[; <hint>]``. The innermost block wins."""
    try:
        yield
    except Exception as e:
        if getattr(e, "largetrain_file", None) is None:
            with contextlib.suppress(AttributeError, TypeError):
                e.largetrain_file = str(path)
                e.add_note(f"while {doing} {path}" + (f"; {hint}" if hint else ""))
        raise


def type_name(t: type) -> str:
    """The full name of exception class ``t``: ``deepspeed.runtime.zero.utils.ZeRORuntimeException``;
    builtins stay bare (``ValueError``)."""
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_transient(e: BaseException) -> bool:
    """Whether ``e`` is a consequence of another process failing rather than an error of this one: a
    ``torch.distributed.DistError`` (store, network, backend), a ConnectionError or TimeoutError, a
    RuntimeError raised inside ``torch/distributed`` (gloo raises a plain RuntimeError from a collective
    when a peer process has died), or the ``SignalException`` of a SIGTERM from outside
    (rank_signals.raise_on_sigterm). A ``TrackerError`` (a tracker failed while the others went on) is
    what the first failing tracker raised: W&B's ConnectionResetError when its service process is
    gone is transient. Everything else (a bad config, a damaged file, a ValueError of a check) would
    fail the same way again."""
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from largetrain_core.training.trackers import TrackerError

    if isinstance(e, TrackerError):
        return is_transient(e.errors[0][1])
    if isinstance(e, (dist.DistError, ConnectionError, TimeoutError, SignalException)):
        return True
    frames = traceback.extract_tb(e.__traceback__)
    return (
        isinstance(e, RuntimeError) and bool(frames) and "/torch/distributed/" in frames[-1].filename.replace("\\", "/")
    )


def error_record(e: BaseException) -> dict:
    """The ``largetrain`` record of exception ``e`` in this rank: type (full name), message, notes, global
    rank, local rank, world size, host, pid, file (what :func:`concerning` marked, else an OSError's
    filename anywhere in the exception chain), where (the innermost frame), transient, time (s since the epoch)."""
    file = next((x.largetrain_file for x in _chain(e) if getattr(x, "largetrain_file", None)), None)
    file = file or next((str(x.filename) for x in _chain(e) if isinstance(x, OSError) and x.filename), None)
    frames = traceback.extract_tb(e.__traceback__)
    env = os.environ
    return {
        "type": type_name(type(e)),
        "message": str(e),
        "notes": list(getattr(e, "__notes__", [])),
        "rank": int(env["RANK"]) if "RANK" in env else None,
        "local_rank": int(env["LOCAL_RANK"]) if "LOCAL_RANK" in env else None,
        "world_size": int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "file": file,
        "where": f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None,
        "transient": is_transient(e),
        "preempted": rank_signals.Preempted is not None and isinstance(e, rank_signals.Preempted),
        "time": time.time(),
    }


def record(fn):
    """``fn`` wrapped by torch's ``torch.distributed.elastic.multiprocessing.errors.record`` with a
    :class:`RankErrorHandler`: an uncaught exception is written to ``TORCHELASTIC_ERROR_FILE`` (when set)
    and raised on."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
    from torch.distributed.elastic.multiprocessing.errors import record as torch_record

    class RankErrorHandler(ErrorHandler):
        """torch's ErrorHandler, writing torch's JSON (``message``: ``"<type>: <message>"``, ``extraInfo``:
        ``py_callstack``, ``timestamp``) with the full type name and the ``largetrain`` record
        (:func:`error_record`) in ``extraInfo``; written to a temporary file and renamed."""

        def record_exception(self, e: BaseException) -> None:
            path = self._get_error_file_path()
            if not path:
                return
            rec = error_record(e)
            data = {
                "message": {
                    "message": f"{rec['type']}: {e}",
                    "extraInfo": {
                        "py_callstack": traceback.format_exc(),
                        "timestamp": str(int(rec["time"])),
                        "largetrain": rec,
                    },
                }
            }
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f, default=str)
            os.replace(tmp, path)

    return torch_record(fn, error_handler=RankErrorHandler())


def rank_errors(log_dir: str | Path) -> list[dict]:
    """Every error record under torchrun's ``log_dir`` (the ranks' ``error.json`` files of every attempt,
    and the agent's own ``torchrun-error.json`` unless it is a copy of a rank's), earliest first. Each
    is :func:`error_record`'s dict plus ``error_file`` and ``traceback``; the agent's own error has
    rank None. A file that cannot be parsed becomes a record saying so."""
    log_dir = Path(log_dir)
    out = []
    for f in sorted(log_dir.glob("*/attempt_*/*/error.json")) + sorted(log_dir.glob(AGENT_ERROR_FILE)):
        try:
            data = json.loads(f.read_text())
            msg = data["message"]
            if isinstance(msg, str):  # torch's newer flat format
                msg = {"message": msg, "extraInfo": {"timestamp": data.get("timestamp", 0)}}
            info = msg.get("extraInfo", {})
        except (OSError, ValueError, KeyError, AttributeError) as e:
            out.append(
                {
                    "type": "unreadable error file",
                    "message": f"{type(e).__name__}: {e}",
                    "rank": None,
                    "file": str(f),
                    "transient": True,
                    "time": f.stat().st_mtime,
                    "error_file": str(f),
                }
            )
            continue
        rec = info.get("largetrain")
        if f.name == AGENT_ERROR_FILE:
            if rec is not None:
                continue  # the agent's copy of the root-cause rank's file, read above
            kind, _, text = msg.get("message", "").partition(": ")
            rec = {
                "type": kind,
                "message": text,
                "rank": None,
                "file": None,
                "where": "torchrun agent",
                "transient": True,
                "time": float(info.get("timestamp", 0)),
            }
        elif rec is None:  # a worker that torch's plain ErrorHandler recorded
            kind, _, text = msg.get("message", "").partition(": ")
            rec = {
                "type": kind,
                "message": text,
                "rank": None,
                "local_rank": int(f.parent.name),
                "file": None,
                "transient": False,
                "time": float(info.get("timestamp", 0)),
            }
        out.append({**rec, "error_file": str(f), "traceback": info.get("py_callstack")})
    return sorted(out, key=lambda r: r.get("time") or 0)


def describe_failure(returncode: int | None, errors: list[dict], max_message: int = 2000) -> tuple[str, bool]:
    """(the message a user sees for a failed torchrun, whether it may be retried).

    One line per recorded error (rank, full exception type, message, the file it concerns, where),
    the earliest first. Retry only when no rank recorded an error of its own, that is when the
    processes were killed or preempted (no error file, or only :func:`is_transient` ones such as a
    collective whose peer died): a deterministic error fails the same way again."""
    own = [r for r in errors if not r.get("transient")]
    preemption = [r for r in errors if r.get("preempted")]
    lines = []
    for r in own + [r for r in errors if r.get("transient")]:
        who = (
            "torchrun agent"
            if r.get("rank") is None and r.get("where") == "torchrun agent"
            else (f"rank {r['rank']}" if r.get("rank") is not None else f"local rank {r.get('local_rank')}")
        )
        text = " ".join([r.get("message") or "", *r.get("notes", [])]).strip()
        text = text if len(text) <= max_message else text[:max_message] + " [...]"
        line = f"{who}: {r['type']}: {text}"
        if r.get("file"):
            line += f" [file: {r['file']}]"
        if r.get("where") and r.get("where") != "torchrun agent":
            line += f" (at {r['where']})"
        lines.append(line + (" (a consequence of another process failing)" if r.get("transient") else ""))
    status = exit_status(returncode)
    if preemption and not own:
        head = (
            f"training preempted ({status} of torchrun): the ranks got SIGTERM and stopped after the same step "
            f"({preemption[0].get('message')}). A retry resumes from the newest complete checkpoint."
        )
    elif own:
        head = (
            f"training failed ({status} of torchrun): {len(own)} rank(s) raised an error. Not retried: it is "
            "deterministic (a config, data or file problem) and would fail the same way again."
        )
    else:
        head = (
            f"training stopped ({status} of torchrun) without an error of its own in any rank: a process was "
            "killed or preempted (a signal, the OOM killer, a lost node). A retry resumes from the newest "
            "complete checkpoint."
        )
    return "\n".join([head, *lines]), not own
