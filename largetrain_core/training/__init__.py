"""Training with DeepSpeed (pretraining and PEFT LoRA), one module per concern:

config.py (TrainConfig, its LoRA and tracker settings, validation), deepspeed_config.py (the
DeepSpeed JSON, precision), trainer.py (the loop), checkpoints.py (save, mark complete, verify, find,
prune, RNG states), flops.py (FLOPs per token, peak, MFU), lora.py (targets, adapter), export.py
(HF model, PEFT adapter, merged), trackers.py (metrics.jsonl, W&B, MLflow, Dagster Pipes),
plots.py (loss curve), __main__.py (the torchrun entry point). Launching and stopping the
processes is largetrain_core.launch.
"""
