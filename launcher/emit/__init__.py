"""Artifacts that make a plan real: DeepSpeed config, device maps, accelerate config, run dir."""
