"""The worker every rank runs: `python -m launcher.train RUN_DIR`.

It reads only the run directory (plan.json, ds_config.json, device_map.json), loads model,
tokenizer and data, applies the plan (DeepSpeed ZeRO / AutoTP, LoRA / QLoRA, checkpointing,
attention, precision), trains with checkpoints and resume, and writes the final weights.
"""
