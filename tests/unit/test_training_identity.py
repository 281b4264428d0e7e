"""A training's identity, read from the marks at each TrainConfig field (largetrain_core.settings.described):
the data versions of the training stages and the checkpoints' config hash."""

import pytest

from largetrain_core.stages.training import training_version
from largetrain_core.training.config import TrainConfig

pytestmark = pytest.mark.unit


def cfg(**settings) -> TrainConfig:
    return TrainConfig.from_settings(output_dir="o", train_shards="s", **settings)


def test_the_data_versions_are_those_recorded_before_the_marks():
    """The versions that the Dagster layer's own list of unversioned settings gave for these configs, so
    that every training trained before is reused."""
    base = cfg(mode="pretrain", max_steps=500, zero_stage=2, precision="fp32")
    assert training_version("base_checkpoint", base, "shardsv", ranks=2, pretrained_model=None) == "a82dbb75d97e9f21"
    lora = cfg(
        mode="lora",
        base_model="b",
        max_steps=300,
        learning_rate=2e-3,
        lora={"r": 16, "lora_alpha": 32.0},
        shuffle_window_shards=2,
        early_stopping_patience=3,
    )
    assert training_version("lora_adapter", lora, "basev", "shardsv", ranks=2) == "e59e899e034bdc3f"


@pytest.mark.parametrize(
    "setting, weights, artifact",
    [
        ({"learning_rate": 0.5}, True, True),  # marked weights
        ({"save_steps": 7}, False, True),  # outputs: the checkpoints kept, not the weights
        ({"lora": {"merge_export": True}}, False, True),
        ({"eval_steps": 7}, False, True),
        ({"train_shards": "elsewhere"}, True, False),  # input: the shards' data version stands for it
        ({"output_dir": "elsewhere"}, False, False),
        ({"report_to": ["mlflow"]}, False, False),  # trackers, resume, preemption, health: neither
        ({"resume_from_checkpoint": "never"}, False, False),
        ({"min_loss_decrease": 0.0}, False, False),
        ({"preset": "llama-tiny"}, False, False),  # a pretraining setting, in a LoRA run
    ],
)
def test_each_mark_decides_what_a_setting_changes(setting, weights, artifact):
    one = cfg(mode="lora", base_model="b")
    other = one.with_settings(**setting)
    assert (one.identity("weights") != other.identity("weights")) is weights
    assert (one.identity("artifact") != other.identity("artifact")) is artifact
    assert (one.config_hash() != other.config_hash()) is weights


def test_evaluation_changes_the_weights_when_early_stopping_acts_on_it():
    early = cfg(early_stopping_patience=2)
    assert early.identity("weights") != early.with_settings(eval_steps=7).identity("weights")
    assert "shuffle_window_shards" not in early.identity("artifact")  # omitted at its default
    assert early.with_settings(shuffle_window_shards=2).identity("artifact")["shuffle_window_shards"] == 2


def test_the_settings_outside_the_run_config_are_the_marked_ones():
    assert TrainConfig.set_outside_run_config() == (
        "output_dir",
        "train_shards",
        "mode",
        "model.base_model",
        "model.tokenizer",
        "tracking.report_to",
        "tracking.run_name",
        "tracking.wandb",
        "tracking.mlflow",
    )


class _Log:
    def __init__(self):
        self.warnings = []

    def warning(self, message):
        self.warnings.append(message)

    info = error = warning


def test_the_stage_builds_its_config_once_and_reads_old_flat_names_through_one_shim(tmp_path):
    """largetrain_core.stages.training.train_config: a run config written the old way (every setting at
    the top level) gives the same TrainConfig and data version as the sectioned one, with one warning
    naming each name moved (config.read_sectioned); the version is the one pinned above; an unknown
    setting is a StageError naming it, before anything is launched."""
    from largetrain_core.stages.base import StageError, StageRun
    from largetrain_core.launch import LocalTorchrun
    from largetrain_core.stages.training import Launch, placed, train_config

    def build(settings: dict):
        log = _Log()
        run = StageRun(root=tmp_path, asset=("base_checkpoint",), log=log)
        built = train_config(run, settings, Launch(LocalTorchrun(2), 2), mode="pretrain", train_shards="s")
        return built, log.warnings, run

    sectioned, quiet, run = build(
        {"schedule": {"max_steps": 500}, "parallelism": {"zero_stage": 2}, "precision": {"dtype": "fp32"}}
    )
    flat, warned, _ = build({"max_steps": 500, "zero_stage": 2, "precision": "fp32"})
    assert flat == sectioned and not quiet
    assert len(warned) == 1 and "settings written without their sections (deprecated)" in warned[0]
    assert "max_steps -> schedule.max_steps" in warned[0] and "precision -> precision.dtype" in warned[0]
    version = training_version("base_checkpoint", flat, "shardsv", ranks=2, pretrained_model=None)
    assert version == "a82dbb75d97e9f21"
    assert "dagster_pipes" in flat.tracking.report_to and flat.tracking.mlflow.tracking_uri.startswith("sqlite:///")
    where = placed(flat, run, version)
    assert where.output_dir == str(tmp_path.resolve() / "base_checkpoint" / version)
    assert where.tracking.run_name == f"base_checkpoint-{version}"
    assert training_version("base_checkpoint", where, "shardsv", ranks=2, pretrained_model=None) == version
    with pytest.raises(StageError, match="max_stepz.*Nothing was launched") as e:
        build({"max_stepz": 5})
    assert not e.value.retryable
