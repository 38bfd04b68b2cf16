"""Imported by every Python process started with this folder on PYTHONPATH (tests/test_user_program.py,
the TRL test): gives accelerate, on a machine without an accelerator, the distributed backend a GPU
machine gives it.

Under DeepSpeed, accelerate picks its backend from the accelerator it finds (nccl for CUDA); on a
CPU-only machine it finds none, records no backend and counts ONE process although DeepSpeed runs a
gloo group of several, so every gather it does fails ("expected length 2, got 1"). The stock Trainer
never gathers during training; TRL's SFTTrainer gathers its token metrics every step. Here, only in
ranks that run DeepSpeed's CPU accelerator, accelerate is told gloo: the answer nccl is on a GPU node.
"""

import importlib.abc
import importlib.util
import os
import sys


def _patch(state) -> None:
    original = state.PartialState._prepare_backend

    def prepare(self, cpu=False, sagemaker_dp=False, backend=None):
        got, kind = original(self, cpu, sagemaker_dp, backend)
        if got is None and os.environ.get("LOCAL_RANK") is not None:
            return "gloo", state.DistributedType.MULTI_CPU
        return got, kind

    state.PartialState._prepare_backend = prepare


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "accelerate.state":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("DS_ACCELERATOR") == "cpu":
    sys.meta_path.insert(0, _AfterImport())
