"""The one process runner (largetrain_dagster.runner.run_process) inside a real Dagster step: what the
child logs and reports through Pipes reaches the run, and a step that fails while the child runs
stops the child's whole tree, also a grandchild in a session of its own (as torchrun's ranks are); a
message the run reads while the child is still writing it arrives whole, and a damaged line is
reported without losing the messages after it."""

import sys
import time
from pathlib import Path

from dagster import DagsterInstance, Failure, MaterializeResult, asset, materialize

from largetrain_core.processes import proc_stat
from largetrain_dagster.runner import run_process

CHILD = """
import subprocess, sys, time
from dagster_pipes import open_dagster_pipes
with open_dagster_pipes() as pipes:
    pipes.log.info("child says hello")
    if sys.argv[1] == "hang":
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        open(sys.argv[2], "w").write(str(g.pid))
        time.sleep(300)
    pipes.report_asset_materialization(metadata={"answer": 42})
"""

# Writes its messages straight into the Pipes message file, as a write caught mid-way would leave
# them: a message in two parts with a pause between them, a line that is not JSON, then a report.
PARTS = """
import json, os, time
from dagster_pipes import DAGSTER_PIPES_MESSAGES_ENV_VAR, decode_param, open_dagster_pipes
with open_dagster_pipes() as pipes:
    path = decode_param(os.environ[DAGSTER_PIPES_MESSAGES_ENV_VAR])["path"]
    params = {"message": "split in two", "level": "INFO"}
    line = json.dumps({"__dagster_pipes_version": "0.1", "method": "log", "params": params})
    def write(text):
        with open(path, "a") as f:
            f.write(text)
    write(line[:45])
    time.sleep(1.0)
    write(line[45:] + "\\n")
    write("{not json\\n")
    pipes.report_asset_materialization(metadata={"answer": 43})
"""


def _alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def test_the_child_logs_and_reports_through_pipes(tmp_path):
    got = {}

    @asset
    def reported(context):
        done = run_process(context, [sys.executable, "-c", CHILD, "ok"], tmp_path / "child.log", "the child")
        got.update(code=done.returncode, metadata=done.metadata)
        return MaterializeResult()

    with DagsterInstance.ephemeral() as instance:
        result = materialize([reported], instance=instance)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert result.success
    assert got["code"] == 0 and got["metadata"]["answer"].value == 42
    assert any("child says hello" in m for m in logs)


def test_a_message_read_while_written_arrives_whole_and_a_damaged_line_loses_nothing_after_it(tmp_path):
    got = {}

    @asset
    def reported(context):
        done = run_process(context, [sys.executable, "-c", PARTS], tmp_path / "child.log", "the child")
        got.update(code=done.returncode, metadata=done.metadata)
        return MaterializeResult()

    with DagsterInstance.ephemeral() as instance:
        result = materialize([reported], instance=instance)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert result.success and got["code"] == 0
    assert any(m == "split in two" for m in logs), logs
    assert any("line 3: not a Pipes message" in m and "{not json" in m for m in logs), logs
    assert got["metadata"]["answer"].value == 43


def test_a_failing_step_stops_the_whole_tree(tmp_path):
    pid_file = tmp_path / "grandchild.pid"

    def give_up():
        if pid_file.exists() and pid_file.read_text():
            raise Failure("the step gave up")

    @asset
    def stopped(context):
        run_process(
            context,
            [sys.executable, "-c", CHILD, "hang", str(pid_file)],
            tmp_path / "child.log",
            "the child",
            grace_seconds=5,
            on_tick=give_up,
            tick_seconds=0.1,
        )

    t0 = time.monotonic()
    with DagsterInstance.ephemeral() as instance:
        result = materialize([stopped], instance=instance, raise_on_error=False)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert not result.success and time.monotonic() - t0 < 60
    grandchild = int(Path(pid_file).read_text())
    assert not _alive(grandchild), f"grandchild {grandchild} survived"
    assert any(m.startswith("stopping the child (process group ") for m in logs), logs
