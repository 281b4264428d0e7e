"""The trackers after the training (largetrain_core.training.trackers.log_outputs), read from a storage root
that was copied elsewhere and whose original is gone: MLflow (a SQLite store in the root, in process); and
W&B + MLflow driven together when W&B fails to finish."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.trackers import Trackers, log_outputs, moved_to


def _config(root, **settings) -> TrainConfig:
    out = root / "base_checkpoint" / "0123456789abcdef"
    return TrainConfig.from_settings(
        output_dir=str(out),
        train_shards=str(root / "token_shards"),
        tokenizer=str(root / "tokenizer"),
        report_to=["mlflow"],
        mlflow={"tracking_uri": f"sqlite:///{root / 'mlruns.db'}"},
        **settings,
    )


def _train(cfg: TrainConfig) -> dict:
    """What a training leaves for log_outputs: its trackers' records, config and summary."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True)
    trackers = Trackers(cfg, rank=0)
    records = trackers.start()
    trackers.log_metrics(1, {"loss": 2.5})
    trackers.finish({"steps": 1, "last_loss": 2.5})
    (out / "train_config.json").write_text(json.dumps(cfg.to_dict()))
    (out / "summary.json").write_text(json.dumps({"steps": 1, "last_loss": 2.5}))
    return records


def test_a_copied_root_logs_to_its_own_mlflow_store_and_writes_nothing_under_the_original(tmp_path, caplog):
    from mlflow.tracking import MlflowClient

    original, copy = tmp_path / "original", tmp_path / "elsewhere" / "copy"
    records = _train(_config(original))
    shutil.copytree(original, copy)
    shutil.rmtree(original)

    with caplog.at_level(logging.WARNING, "largetrain_core.training.trackers"):
        logged = log_outputs(copy / "base_checkpoint" / "0123456789abcdef", [copy / "token_shards"], {"acc": 0.5})
    assert logged == ["mlflow"]
    assert not original.exists()  # neither the store nor the artifacts were written at the old place
    run = MlflowClient(f"sqlite:///{copy / 'mlruns.db'}").get_run(records["mlflow"]["run_id"])
    assert run.data.metrics["acc"] == 0.5 and run.data.metrics["loss"] == 2.5
    assert run.info.status == "FINISHED"
    assert "outside this store's" in caplog.text and "its artifacts are not" in caplog.text


def test_moved_to_rebases_the_output_directory_and_a_store_under_the_old_root_only(tmp_path):
    old, new = tmp_path / "a" / "root", tmp_path / "b" / "copy"
    cfg = _config(old)
    out = new / "base_checkpoint" / "0123456789abcdef"
    moved = moved_to(cfg, out)
    assert moved.output_dir == str(out)
    assert moved.tracking.mlflow.tracking_uri == f"sqlite:///{new / 'mlruns.db'}"
    assert moved.settings() | {"output_dir": None, "mlflow": None} == cfg.settings() | {
        "output_dir": None,
        "mlflow": None,
    }
    elsewhere = cfg.with_settings(mlflow={"tracking_uri": f"sqlite:///{tmp_path / 'shared' / 'mlruns.db'}"})
    assert moved_to(elsewhere, out).tracking.mlflow == elsewhere.tracking.mlflow  # not under the root: kept
    server = cfg.with_settings(mlflow={"tracking_uri": "http://127.0.0.1:5000"})
    assert moved_to(server, out).tracking.mlflow.tracking_uri == "http://127.0.0.1:5000"
    assert moved_to(cfg, Path(cfg.output_dir)) is cfg  # not moved


def test_a_root_named_through_a_link_is_not_taken_for_a_moved_one(tmp_path, caplog):
    """The training recorded its root through a symbolic link; read through the link's target, nothing
    moved: the store and its artifact location are the recorded ones, and no warning."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "disk").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "disk")
    records = _train(_config(tmp_path / "link" / "root"))
    out = tmp_path / "disk" / "root" / "base_checkpoint" / "0123456789abcdef"
    assert moved_to(_config(tmp_path / "link" / "root"), out).output_dir == str(
        tmp_path / "link" / "root" / "base_checkpoint" / "0123456789abcdef"
    )
    with caplog.at_level(logging.WARNING, "largetrain_core.training.trackers"):
        assert log_outputs(out, [out / "summary.json"], {"acc": 0.5}) == ["mlflow"]
    assert "outside this store's" not in caplog.text
    client = MlflowClient(f"sqlite:///{tmp_path / 'disk' / 'root' / 'mlruns.db'}")
    assert client.get_run(records["mlflow"]["run_id"]).data.metrics["acc"] == 0.5
    assert [a.path for a in client.list_artifacts(records["mlflow"]["run_id"])] == ["summary.json"]


# Drives Trackers under report_to wandb (offline) + mlflow, then kills W&B's service process (wandb-core, a
# child of this process), as a cancel that reaches the process group does: W&B's run.finish then raises
# ConnectionResetError from wandb itself. Prints what Trackers.finish raised and the trackers' records.
W_AND_B_LOST = """
import json, os, signal, sys
from pathlib import Path
from largetrain_core.training.config import TrainConfig
from largetrain_core.training.trackers import TrackerError, Trackers

root, outcome = Path(sys.argv[1]), sys.argv[2]
cfg = TrainConfig.from_settings(
    output_dir=str(root / "run"), train_shards=str(root / "shards"), tokenizer=str(root / "tokenizer"),
    report_to=["wandb", "mlflow"], mlflow={"tracking_uri": f"sqlite:///{root / 'mlruns.db'}"},
)
Path(cfg.output_dir).mkdir(parents=True)
trackers = Trackers(cfg, rank=0)
records = trackers.start()
trackers.log_metrics(1, {"loss": 2.5})
import time


def parent(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def ours(pid):  # a descendant of this process (W&B may start its service through a launcher)
    while pid > 1:
        pid = parent(pid)
        if pid == os.getpid():
            return True
    return False


def wandb_core():
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().strip() == "wandb-core" and ours(int(p.name)):
                found.append(int(p.name))
        except OSError:
            continue
    return found


deadline = time.monotonic() + 30
core = wandb_core()
while not core and time.monotonic() < deadline:
    time.sleep(0.2)
    core = wandb_core()
for pid in core:
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # a grandchild: not ours to reap; wait until it is gone
        while Path(f"/proc/{pid}").exists() and (Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"):
            time.sleep(0.05)
try:
    trackers.finish({"steps": 1, "last_loss": 2.5} if outcome == "succeeded" else None, killed=outcome == "killed")
    raised = None
except TrackerError as e:
    raised = {"message": str(e), "cause": type(e.__cause__).__name__, "trackers": [n for n, _ in e.errors]}
print(json.dumps({"killed_wandb_core": len(core), "raised": raised, "records": records}))
"""


@pytest.mark.parametrize("outcome,status", [("killed", "KILLED"), ("succeeded", "FINISHED")])
def test_mlflow_run_ends_when_wandb_fails_to_finish(tmp_path, outcome, status):
    """W&B (offline, its real service process killed, so wandb's own run.finish raises
    ConnectionResetError) and MLflow (a SQLite store): Trackers.finish still finishes MLflow's run,
    KILLED after a cancel or FINISHED after success (read back with MlflowClient), closes metrics.jsonl,
    and then raises TrackerError naming W&B with wandb's exception as its cause."""
    from mlflow.tracking import MlflowClient

    r = subprocess.run(
        [sys.executable, "-c", W_AND_B_LOST, str(tmp_path), outcome],
        cwd=REPO,
        # its own W&B service: a service that an earlier test started in this process is named in the inherited
        # WANDB_SERVICE, and a child would join it instead of starting the wandb-core it kills
        env={**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}, "WANDB_SILENT": "true"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["killed_wandb_core"] == 1
    raised = result["raised"]
    assert raised["trackers"] == ["wandb"] and raised["cause"] == "ConnectionResetError"
    assert raised["message"].startswith("tracker 'wandb' failed to finish: ConnectionResetError: ")
    assert raised["message"].endswith("(every other tracker did it all the same)")
    assert "tracker 'wandb' failed to finish: ConnectionResetError" in r.stderr  # logged when it happened

    run = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}").get_run(result["records"]["mlflow"]["run_id"])
    assert run.info.status == status and run.info.end_time is not None
    assert run.data.metrics == {"loss": 2.5}
    artifacts = [a.path for a in MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}").list_artifacts(run.info.run_id)]
    assert artifacts == (["summary.json"] if outcome == "succeeded" else [])
    assert [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "loss": 2.5}
    ]
    assert result["records"]["wandb"]["mode"] == "offline"
    assert len(list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{result['records']['wandb']['run_id']}"))) == 1


def test_an_exported_model_is_logged_as_an_mlflow_model_that_loads_and_registers(tmp_path, bpe_dir):
    """log_outputs of a training's model/ directory: MLflow holds the plain copy at ``model`` and an MLflow
    model (MLmodel, transformers flavor) at ``mlflow/model``, which ``mlflow.transformers.load_model``
    loads as a text-generation pipeline giving the greedy tokens of the directory itself, and which the
    model registry takes (``mlflow.register_model``, then ``models:/NAME/1``). An adapter directory is
    only copied."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from transformers import pipeline

    from largetrain_core.model import build_model
    from largetrain_core.tokenizer import load_tokenizer_info, save_hf_tokenizer

    cfg = _config(tmp_path)
    records = _train(cfg)
    out = Path(cfg.output_dir)
    info = load_tokenizer_info(bpe_dir)
    build_model("llama-tiny", info.vocab_size, 64, info.eos_id, seed=2).save_pretrained(str(out / "model"))
    save_hf_tokenizer(info, out / "model")
    (out / "adapter").mkdir()
    (out / "adapter" / "adapter_config.json").write_text("{}")
    assert log_outputs(out, [out / "model", out / "adapter"]) == ["mlflow"]

    uri, run_id = records["mlflow"]["tracking_uri"], records["mlflow"]["run_id"]
    client = MlflowClient(tracking_uri=uri)
    assert {a.path for a in client.list_artifacts(run_id)} >= {"model", "adapter", "mlflow"}
    assert [a.path for a in client.list_artifacts(run_id, "mlflow")] == ["mlflow/model"]
    assert client.get_run(run_id).data.tags["mlflow_model.model"] == f"runs:/{run_id}/mlflow/model"
    prompt = "The cat walks to"
    want = pipeline("text-generation", model=str(out / "model"))(prompt, max_new_tokens=6, do_sample=False)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)  # the fluent API's store: this test's, then back
    try:
        loaded = mlflow.transformers.load_model(f"runs:/{run_id}/mlflow/model")
        assert loaded(prompt, max_new_tokens=6, do_sample=False) == want
        version = mlflow.register_model(f"runs:/{run_id}/mlflow/model", "largetrain-tiny")
        assert int(version.version) == 1
        registered = mlflow.transformers.load_model("models:/largetrain-tiny/1")
        assert registered(prompt, max_new_tokens=6, do_sample=False) == want
    finally:
        mlflow.set_tracking_uri(previous)


def test_the_ui_command_of_a_tracking_server_is_its_address():
    from largetrain_core.training.trackers import ui_command

    assert ui_command("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert ui_command("sqlite:////data/mlruns.db") == "mlflow ui --backend-store-uri sqlite:////data/mlruns.db"
