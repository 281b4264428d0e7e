"""Schedules: retraining the LoRA adapter on a cron."""

from __future__ import annotations

from dagster import AssetSelection, DefaultScheduleStatus, ScheduleDefinition

retrain_lora_adapter = ScheduleDefinition(
    name="retrain_lora_adapter",
    cron_schedule="0 3 * * 0",  # Sundays 03:00 UTC
    execution_timezone="UTC",
    target=AssetSelection.assets("lora_adapter"),
    # STOPPED by default: a retraining occupies the accelerators for hours, so an operator turns the
    # schedule on deliberately (UI: Automation, or `dagster schedule start retrain_lora_adapter`) once
    # base_checkpoint and domain/token_shards exist; a fresh deployment never starts a training by itself.
    default_status=DefaultScheduleStatus.STOPPED,
    description="Retrain the LoRA adapter weekly on the current base checkpoint and domain shards (production config defaults).",
)
