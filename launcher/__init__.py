"""ftlaunch: plan, emit and launch multi-GPU fine-tuning of large language models."""

__version__ = "0.1.0"
