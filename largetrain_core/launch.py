"""Launching a training: the launch commands for one or several nodes, the fault-injection hook the
tests use to crash a run the way a power cut would, and each rank's error record. Starting and
stopping processes in general is largetrain_core.processes.

Error records use what torch's elastic launcher offers: torchrun (``--log-dir DIR``) gives every rank
the path of its error file in ``TORCHELASTIC_ERROR_FILE``
(``DIR/<run id>_<random>/attempt_<n>/<local rank>/error.json``); the entry point, wrapped by
:func:`record` (torch's ``torch.distributed.elastic.multiprocessing.errors.record`` with
:class:`RankErrorHandler`), writes its uncaught exception there in torch's JSON format, plus a
``largetrain`` record: the exception's full type name, message, global rank, the file it concerns,
and whether it is *transient*. :func:`rank_errors` reads them back and :func:`describe_failure`
turns them into the message a user sees and the decision whether to retry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import socket
import time
import traceback
from pathlib import Path

from largetrain_core.processes import exit_status, process_tree

log = logging.getLogger("largetrain.launch")

ENTRY_MODULE = "largetrain_core.training"


class FaultInjection:
    """LARGETRAIN_FAULT as a hook of the training loop (largetrain_core.training.trainer.Trainer's
    ``hooks``): :func:`maybe_fault` after a step's metrics row and in the middle of a save."""

    def after_step(self, step: int, rank: int) -> None:
        maybe_fault("after_step", step, rank)

    def mid_save(self, step: int, rank: int) -> None:
        maybe_fault("mid_save", step, rank)


def maybe_fault(point: str, step: int, rank: int) -> None:
    """LARGETRAIN_FAULT: comma-separated faults that rank 0 injects, each ``<kind>:<step>``, in the order given.

    * ``after_step:N`` (after step N's metrics row), ``mid_save:N`` (after this rank's ``save_checkpoint``
      of step N returned, before the barrier and the completion marker): SIGKILL to the torchrun agent,
      every rank and itself at once, as a crash, a power cut or the end of a preemption's grace period would.
    * ``sigterm_after_step:N``: SIGTERM to the torchrun agent and every rank, as a node being preempted
      (its pod deleted, the spot instance reclaimed) sends; the run goes on to its preemption save.
    * ``sigterm_mid_save:N``: another SIGTERM to every rank during the save of step N (the one the
      torchrun agent forwards, or a second stop), which the ranks ignore (:func:`defer_sigterm`)."""
    spec = os.environ.get("LARGETRAIN_FAULT", "")
    if rank != 0 or not spec:
        return
    import signal

    me = os.getpid()
    for fault in spec.split(","):
        kind = fault.strip()
        if kind == f"sigterm_{point}:{step}":
            tree = process_tree(os.getppid())
            targets = tree if point == "after_step" else tree[1:]
            log.warning(
                f"LARGETRAIN_FAULT {kind}: SIGTERM to {'the torchrun agent and ' if point == 'after_step' else ''}"
                "every rank"
            )
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        elif kind == f"{point}:{step}":
            log.warning(f"LARGETRAIN_FAULT {kind}: SIGKILL to the torchrun agent and all ranks")
            for h in logging.getLogger().handlers:
                h.flush()
            for pid in process_tree(os.getppid()):
                if pid != me:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            os.kill(me, signal.SIGKILL)


def finish_rank() -> None:
    """End a rank whose outputs are all written and fsynced: a barrier, the process group destroyed,
    logs and standard streams flushed, then ``os._exit(0)``. The interpreter's teardown is skipped on
    purpose: destructors of DeepSpeed's/gloo's native threads can abort a finished rank there
    ("terminate called without an active exception", seen with ZeRO-3 on CPU), which would turn a
    finished run into a failed one. Never returns."""
    import sys

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_terminated: list[int] = []  # the signal that raise_on_sigterm turned into an exception, once received


def raise_on_sigterm() -> None:
    """From now on the first SIGTERM to this process raises torch elastic's ``SignalException`` in its main
    thread (as torchrun's agent does for itself), so that a rank stopped from outside (the run cancelled,
    its pod or node stopping, torchrun stopping the other ranks after one failed) unwinds through its
    ``except``/``finally`` blocks: the trackers record the run as killed (:func:`terminated`). Python's
    default would end the process at once. Later SIGTERMs are ignored, so that this cleanup is not cut
    short; the launcher's SIGKILL after its grace period still ends the process. Main thread only."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _terminated.append(signum)
        raise SignalException(
            f"process {os.getpid()} received {signal.Signals(signum).name}: stopped from outside",
            sigval=signal.Signals(signum),
        )

    signal.signal(signal.SIGTERM, handler)


def terminated() -> bool:
    """Whether this process received the SIGTERM that :func:`raise_on_sigterm` or :func:`defer_sigterm` handles."""
    return bool(_terminated)


def defer_sigterm() -> None:
    """From now on the first SIGTERM to this process only marks it :func:`terminated` (the training
    then saves a checkpoint at the end of its step and raises :func:`preempted`'s exception); later SIGTERMs are
    ignored, so that this save is not cut short by the SIGTERM that torchrun's agent forwards to its
    ranks. The launcher's SIGKILL after the grace period still ends the process. Main thread only.
    A SIGTERM already received stays received."""
    import signal

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _terminated.append(signum)  # no logging here: a handler runs between any two bytecodes of the main thread

    if not _terminated:
        signal.signal(signal.SIGTERM, handler)


Preempted = None  # the exception class of a preempted rank, made on first use (torch is imported late)


def preempted(message: str):
    """The exception a preempted rank ends with once its checkpoint is saved: ``Preempted``, a torch
    elastic ``SignalException`` (sigval SIGTERM), so :func:`is_transient` holds and the run is retried;
    its error record says ``preempted: true``."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    global Preempted
    if Preempted is None:
        Preempted = type(
            "Preempted",
            (SignalException,),
            {
                "__module__": __name__,
                "__doc__": ("A SIGTERM'd rank's end after its preemption save (transient: retried)."),
            },
        )
    return Preempted(message, sigval=signal.SIGTERM)


def launch_commands(
    config_path: str,
    hosts: list[str],
    nproc_per_node: int,
    port: int = 29500,
    rdzv_backend: str = "static",
    python: str = "python",
    log_dir: str | None = None,
    module: str = ENTRY_MODULE,
) -> dict:
    """The commands that start ``module`` (the training; or the ablation,
    largetrain_core.training.ablation) with ``config_path`` on ``hosts`` (node rank = position in the
    list; the first host holds the rendezvous store), ``nproc_per_node`` ranks on each.

    Returns ``{"torchrun": [one command per node, to run on that node], "hostfile": DeepSpeed hostfile
    text ("host slots=N" lines), "deepspeed": the one command to run on hosts[0] with that hostfile
    (the deepspeed launcher reaches the other hosts by pdsh/ssh)}``. rdzv_backend "static": torchrun's
    fixed ranks (--node_rank, --master_addr/--master_port); "c10d": elastic rendezvous at hosts[0]:port,
    node ranks assigned by the rendezvous. ``log_dir``: torchrun's ``--log-dir``, where each rank's
    error file is written (:func:`rank_errors` reads them). Raises ValueError on an empty host list or bad backend.
    """
    if not hosts or nproc_per_node < 1:
        raise ValueError("need at least one host and nproc_per_node >= 1")
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"rdzv_backend must be 'static' or 'c10d', not {rdzv_backend!r}")
    n = len(hosts)
    cmds = []
    for i in range(n):
        if n == 1:
            where = "--standalone"
        elif rdzv_backend == "static":
            where = f"--nnodes {n} --node_rank {i} --master_addr {hosts[0]} --master_port {port}"
        else:
            where = f"--nnodes {n} --rdzv_backend c10d --rdzv_endpoint {hosts[0]}:{port} --rdzv_id largetrain"
        logs = f"--log-dir {shlex.quote(str(log_dir))} " if log_dir else ""
        cmds.append(
            f"{shlex.quote(python)} -m torch.distributed.run {where} --nproc_per_node {nproc_per_node} "
            f"{logs}-m {module} {shlex.quote(str(config_path))}"
        )
    hostfile = "".join(f"{h} slots={nproc_per_node}\n" for h in dict.fromkeys(hosts))
    ds = (
        f"deepspeed --hostfile hostfile --master_addr {hosts[0]} --master_port {port} "
        f"--module {module} {shlex.quote(str(config_path))}"
    )
    return {"torchrun": cmds, "hostfile": hostfile, "deepspeed": ds}


# ----------------------------------------------------------------------------------------------
# error records

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
    (:func:`raise_on_sigterm`). A ``TrackerError`` (a tracker failed while the others went on) is
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
        "preempted": Preempted is not None and isinstance(e, Preempted),
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
