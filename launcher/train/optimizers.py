"""The optimizer the plan names, where the worker builds it rather than DeepSpeed's config
(which builds AdamW): SGD, Adafactor, bitsandbytes' 8-bit and paged AdamW, and one optimizer per
parameter when the step runs inside the backward (in_backward.py)."""

from __future__ import annotations

from launcher.spec import TrainSpec


def client_optimizer(spec: TrainSpec, params, lr: float, weight_decay: float, hidden: int = 0):
    """Optimizers DeepSpeed does not build from its config; None means the config's AdamW. In
    backward (in_backward.py): one per parameter, AdamW included, stepped from the backward with
    the gradients averaged in buckets of hidden² elements (the memory model's reduce bucket)."""
    if spec.optimizer_step == "in-backward":
        from launcher.train import in_backward

        def one(p):
            return one_optimizer(spec, p, lr, weight_decay)

        return in_backward.optimizer(params, one, lr, hidden * hidden)
    if spec.optimizer == "adamw":
        return None
    return one_optimizer(spec, params, lr, weight_decay)


def one_optimizer(spec: TrainSpec, params, lr: float, weight_decay: float):
    import torch

    if spec.optimizer == "adamw":  # in backward only (else DeepSpeed's, from the config)
        # fused: one kernel per parameter on the GPU and on the CPU (no temporaries of its size)
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay, fused=True)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if spec.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    import bitsandbytes as bnb

    cls = {
        "adamw-8bit": bnb.optim.AdamW8bit,
        # paged: states in CUDA unified memory (bitsandbytes falls back to ordinary states on a CPU)
        "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
        "paged-adamw": bnb.optim.PagedAdamW32bit,
    }[spec.optimizer]
    return cls(params, lr=lr, weight_decay=weight_decay)
