"""A running training's progress read from its metrics.jsonl as rank 0 appends to it."""

import json

from largetrain_dagster.progress import TrainingProgress, duration


def test_progress_follows_the_metrics_file_as_it_grows(tmp_path):
    reader = TrainingProgress(tmp_path)
    assert reader.poll(now=0.0) is None  # nothing written yet
    (tmp_path / "train_config.json").write_text(json.dumps({"max_steps": 100, "lr": 1e-3}))
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "w") as fh:
        fh.write(json.dumps({"step": 10, "loss": 7.12345, "tokens_per_s": 5432.1}) + "\n")
        fh.write('{"step": 11, "loss": 7.0')  # a row still being written
    p = reader.poll(now=100.0)
    assert (p.step, p.total, p.loss, p.eta_s) == (10, 100, 7.12345, None)  # one step seen: no rate yet
    assert p.line() == "step 10/100 (10%), loss 7.123, 5,432 tokens/s"

    with open(metrics, "a") as fh:
        fh.write(', "tokens_per_s": 5000.0}\n')
        for step in range(12, 31):
            fh.write(json.dumps({"step": step, "loss": 6.5, "tokens_per_s": 5000.0}) + "\n")
    p = reader.poll(now=140.0)  # 20 steps in 40 s since the first reading: 2 s a step, 70 steps left
    assert (p.step, p.loss, p.eta_s) == (30, 6.5, 140.0)
    assert p.line() == "step 30/100 (30%), loss 6.500, 5,000 tokens/s, ETA 2 min 20 s"


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (4.4, 59.6, 190, 3600 + 5 * 60 + 10)] == ["4 s", "1 min 0 s", "3 min 10 s", "1 h 05 min"]


def test_a_finished_training_shows_no_eta(tmp_path):
    (tmp_path / "train_config.json").write_text(json.dumps({"max_steps": 2}))
    reader = TrainingProgress(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "tokens_per_s": 10.0}) + "\n")
    reader.poll(now=0.0)
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 2, "loss": 2.5, "tokens_per_s": 12.0}) + "\n")
    assert reader.poll(now=1.0).line() == "step 2/2 (100%), loss 2.500, 12 tokens/s"
