"""A training rank's signals and its end: SIGTERM turned into an exception (:func:`raise_on_sigterm`) or
deferred to the end of the step (:func:`defer_sigterm`, a preemption save), the exception a preempted rank
ends with (:func:`preempted`), the fault-injection hook the tests use to crash a run the way a power cut
or a preemption would (LARGETRAIN_FAULT), and :func:`finish_rank`. Error records of a failed rank are
largetrain_core.error_records; the torchrun command is largetrain_core.launch."""

from __future__ import annotations

import contextlib
import logging
import os

from largetrain_core.processes import process_tree

log = logging.getLogger("largetrain.launch")


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
    elastic ``SignalException`` (sigval SIGTERM), so error_records.is_transient holds and the run is retried;
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
