"""Training with DeepSpeed (pretraining and PEFT LoRA), one module per concern:

config.py (TrainConfig, its LoRA and tracker settings, validation), deepspeed_config.py (the
DeepSpeed JSON, precision), trainer.py (the loop), loss.py (the loss of training, evaluation and
perplexity), checkpoints.py (save, mark complete, verify, find, prune, RNG states), flops.py (FLOPs
per token, peak, MFU), lora.py (targets, adapter), export.py (HF model, PEFT adapter, merged),
trackers.py (metrics.jsonl, W&B, MLflow, Dagster Pipes), health.py (whether a finished run is
healthy, the training assets' blocking check; rate-limited step warnings), plots.py (loss curve),
plan.py (the training plan: memory, disk, time and cost before launch, the blocking check),
calibrate.py (a few measured steps before launch: tokens/s, memory, checkpoint), __main__.py (the
torchrun entry point). Launch commands are largetrain_core.launch, a rank's signals largetrain_core.rank_signals, its error records largetrain_core.error_records; starting and
stopping processes, largetrain_core.processes.
"""
