"""What the driver is doing, for people: the step's name (Spark's job description) and Spark stage
progress from a polling thread."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from pyspark.sql import SparkSession


class Progress:
    """The step the driver is in: named for Spark (the job group and description of the next jobs) and
    for the progress log (:func:`progress`); ``log`` is where the stage functions' own lines go."""

    def __init__(self, spark: SparkSession, log: Callable[[str], None] = lambda m: None):
        self.spark, self.log, self.step = spark, log, ""
        self.groups: list[tuple[str, str]] = []  # (Spark job group, step), in order

    def describe(self, description: str) -> None:
        group = f"largetrain-step-{len(self.groups)}"
        self.groups.append((group, description))
        self.spark.sparkContext.setJobGroup(group, description)
        self.step = description


@contextlib.contextmanager
def progress(spark: SparkSession, log: Callable[[str], None], every: float = 1.0) -> Iterator[Progress]:
    """Log Spark stage progress (``Spark stage N [step]: done/total tasks, running``) from a thread
    polling the status tracker every ``every`` seconds, and each stage's end (``finished``, or
    ``skipped`` when its output was reused). Every stage of every step's jobs is logged at least once,
    however short: the stages are found through the steps' job groups, and the thread polls once more
    when the block ends. Yields the :class:`Progress` whose steps the lines name (pass it to the stage
    functions)."""
    steps = Progress(spark, log)
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    seen: dict[int, tuple] = {}
    ended: set[int] = set()

    def poll_once() -> None:
        active = set(tracker.getActiveStageIds())
        for group, step in list(steps.groups):
            for jid in sorted(tracker.getJobIdsForGroup(group)):
                job = tracker.getJobInfo(jid)
                if job is None:
                    continue
                for sid in sorted(set(job.stageIds) - ended):
                    info = tracker.getStageInfo(sid)
                    if info is None:
                        continue
                    state = (info.numCompletedTasks, info.numActiveTasks, info.numFailedTasks)
                    if (sid in active or info.numCompletedTasks) and seen.get(sid) != state:
                        failed = f", {info.numFailedTasks} failed (retried)" if info.numFailedTasks else ""
                        log(
                            f"Spark stage {sid} [{step}]: {info.numCompletedTasks}/{info.numTasks} tasks done, "
                            f"{info.numActiveTasks} running{failed}"
                        )
                        seen[sid] = state
                    if sid not in active and (info.numCompletedTasks >= info.numTasks or job.status != "RUNNING"):
                        log(
                            f"Spark stage {sid} finished ({info.numTasks} tasks)"
                            if sid in seen
                            else f"Spark stage {sid} [{step}]: skipped (its output was reused)"
                        )
                        ended.add(sid)

    def poll():
        while not stop.wait(every):
            try:
                poll_once()
            except Exception:  # noqa: BLE001 -- the context is stopping; progress is best effort
                return

    t = threading.Thread(target=poll, name="spark-progress", daemon=True)
    t.start()
    try:
        yield steps
    finally:
        stop.set()
        t.join(timeout=5)
        with contextlib.suppress(Exception):  # the session may be gone (the step failed)
            poll_once()
