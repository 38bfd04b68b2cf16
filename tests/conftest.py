"""Test-wide settings: DeepSpeed runs on its CPU accelerator here (no GPU on CI)."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
