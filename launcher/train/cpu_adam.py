"""Exact resume for DeepSpeed's CPU Adam kernels.

DeepSpeed's C++ Adam on the CPU -- FusedAdam under the CPU accelerator, and DeepSpeedCPUAdam, the
optimizer of every ZeRO-Offload run on GPUs too -- keeps beta1^t and beta2^t of the bias correction
as a running product in the process (`Adam_Optimizer::IncrementStep`): each step multiplies them by
beta once more. A checkpoint holds the step count, not that product, and a restarted process
recomputes it as pow(beta, t), which rounds differently in the last bit. Measured on this machine
(2 ranks, bf16, ZeRO-1): the loaded state was bitwise the untouched run's, the gradients of the
first step after the resume too, yet its update differed by one ulp, and the loss one step later by
3.7e-5. The two roundings agree after some step counts (1, 3, 4, 6, 7) and not after others (2, 5),
so a fault test resuming at a lucky step passed bitwise and at an unlucky one did not.

`replay_bias_correction` rebuilds the running product after a load: it calls the kernel once per
step 1..t on empty tensors, which runs IncrementStep and updates nothing (t calls of a few
microseconds). CUDA's FusedAdam computes pow(beta, t) on every step and needs nothing.
"""

from __future__ import annotations

_MAX_WRAPS = 4  # engine.optimizer -> ZeRO / BF16 wrapper -> the base optimizer


def _base_optimizer(optimizer):
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam

    for _ in range(_MAX_WRAPS):
        if isinstance(optimizer, (FusedAdam, DeepSpeedCPUAdam)):
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
        if optimizer is None:
            return None
    return None


def _steps_taken(optimizer) -> int:
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(steps, default=0)


def replay_bias_correction(engine_optimizer) -> int:
    """Bring a freshly loaded CPU Adam's running beta^t to where the run that saved the checkpoint
    had it. Returns the number of steps replayed (0 when the optimizer is not a CPU Adam kernel or
    has not stepped)."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    base = _base_optimizer(engine_optimizer)
    if base is None:
        return 0
    cpu_kernel = isinstance(base, DeepSpeedCPUAdam) or get_accelerator().device_name() == "cpu"
    steps = _steps_taken(base) if cpu_kernel else 0
    if not steps or not base.param_groups:
        return 0
    group = base.param_groups[0]
    beta1, beta2 = group["betas"]
    empty = torch.empty(0, dtype=torch.float32)
    for step in range(1, steps + 1):
        if isinstance(base, DeepSpeedCPUAdam):
            base.ds_opt_adam.adam_update(
                base.opt_id, step, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                group["bias_correction"], empty, empty, empty, empty,
            )
        else:  # FusedAdam's CPU op: one kernel instance per Adam / AdamW mode, shared in the process
            base.multi_tensor_adam(
                2048 * 32, base._dummy_overflow_buf, [[empty], [empty], [empty], [empty]],
                group["lr"], beta1, beta2, group["eps"], step, base.adam_w_mode,
                1 if group["bias_correction"] else 0, group["weight_decay"],
            )
    return steps
