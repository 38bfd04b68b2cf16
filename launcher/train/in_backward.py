"""The optimizer step inside the backward (`--optimizer-step in-backward`, torchtune's
optimizer_in_bwd): each trained parameter has an optimizer of its own, stepped by a hook the
moment its gradient is complete, and the gradient is freed right after. The whole model's
gradients never exist at once; what does is one parameter's (one rank) or a bucket of them
waiting for their all-reduce (data parallel): memory/states.py in_backward_window.

Under DeepSpeed's data-parallel engine at ZeRO-0 (spec.in_backward_conflict says where else it
cannot run): the engine's own gradient all-reduce after the backward is switched off
(engines.py), gradients are averaged here as they come, and `step()` -- which the engine calls
after the backward -- only finishes the last bucket. The learning-rate scheduler, checkpoints and
resume see one ordinary torch optimizer: param_groups for the scheduler, state_dict() holding
every parameter's optimizer state in the model's parameter order.

With more than one rank a gradient's all-reduce starts (asynchronously) as soon as it is
complete; once the gradients waiting for theirs reach IN_BACKWARD_BUCKET_ELEMS (hidden² elements,
the reduce bucket the memory model counts) the oldest are waited for, averaged, applied and
freed. No gradient clipping: the global norm needs every gradient at once (the DeepSpeed config
sets it to 0 and the plan says so).
"""

from __future__ import annotations

from collections.abc import Callable


def _optimizer_class():
    import torch

    class InBackward(torch.optim.Optimizer):
        """One optimizer per parameter, stepped from the backward (see the module docstring)."""

        def __init__(self, params, make: Callable, lr: float, bucket_elems: int, group=None):
            import torch.distributed as dist

            params = list(params)
            super().__init__(params, {"lr": lr})
            self.inner = [make([p]) for p in params]
            self.index = {id(p): i for i, p in enumerate(params)}
            self.world = dist.get_world_size(group) if dist.is_initialized() else 1
            self.group = group
            self.bucket_elems = bucket_elems
            self.waiting: list[tuple[torch.nn.Parameter, object]] = []
            self.waiting_elems = 0
            for p in params:
                p.register_post_accumulate_grad_hook(self._complete)

        def _complete(self, p) -> None:
            import torch.distributed as dist

            if self.world == 1:
                self._apply(p)
                return
            work = dist.all_reduce(p.grad, group=self.group, async_op=True)
            self.waiting.append((p, work))
            self.waiting_elems += p.numel()
            if self.waiting_elems >= self.bucket_elems:
                self._drain()

        def _drain(self) -> None:
            for p, work in self.waiting:
                work.wait()
                p.grad.div_(self.world)
                self._apply(p)
            self.waiting, self.waiting_elems = [], 0

        def _apply(self, p) -> None:
            opt = self.inner[self.index[id(p)]]
            for inner in opt.param_groups:  # the scheduler sets the outer group's learning rate
                inner["lr"] = self.param_groups[0]["lr"]
            opt.step()
            p.grad = None

        @torch.no_grad()
        def step(self, closure=None):
            """The backward has stepped every parameter but the last bucket's: apply those."""
            self._drain()

        def zero_grad(self, set_to_none: bool = True) -> None:
            pass  # every gradient was freed when its parameter was stepped

        def state_dict(self) -> dict:
            return {"lr": self.param_groups[0]["lr"], "per_parameter": [opt.state_dict() for opt in self.inner]}

        def load_state_dict(self, state: dict) -> None:
            saved = state["per_parameter"]
            if len(saved) != len(self.inner):
                raise ValueError(f"optimizer state for {len(saved)} parameters, this model trains {len(self.inner)}")
            for opt, one in zip(self.inner, saved, strict=True):
                opt.load_state_dict(one)
            self.param_groups[0]["lr"] = state["lr"]

    return InBackward


def optimizer(params, make: Callable, lr: float, bucket_elems: int, group=None):
    """The in-backward optimizer over `params`; `make([p])` builds one parameter's optimizer."""
    return _optimizer_class()(params, make, lr, bucket_elems, group)
