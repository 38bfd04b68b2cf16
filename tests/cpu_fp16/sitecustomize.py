"""Imported by every Python process started with this folder on PYTHONPATH (tests/runs.py
`cpu_fp16_env`): fixes the answer to "does this CPU have oneDNN fp16 kernels?" that DeepSpeed's CPU
accelerator (and ftlaunch's check in front of it, launcher/train/model.py) asks, to
FTLAUNCH_TEST_CPU_FP16 (1 or 0).

The answer differs between the CPUs CI lands on (AVX512-FP16 / AMX-FP16 or not), so a test of the
fp16 training path would pass on one machine and fail on the next. With 1, DeepSpeed's loss-scaled
fp16 optimizer runs for real; torch computes fp16 on any CPU, oneDNN only makes it fast. With 0,
the refusal a user on such a CPU meets is tested on every machine.
"""

import os

_want = os.environ.get("FTLAUNCH_TEST_CPU_FP16")
if _want in ("0", "1"):
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    CPU_Accelerator.is_fp16_supported = lambda self: _want == "1"
