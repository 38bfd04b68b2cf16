"""Model parallelism the worker runs: how a plan splits the blocks into pipeline stages
(split.py, torch-free: the memory model, the planner and the worker share it) and the stage
adapters that turn a Hugging Face model into DeepSpeed pipeline layers (stages.py)."""
