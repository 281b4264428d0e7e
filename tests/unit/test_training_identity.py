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
