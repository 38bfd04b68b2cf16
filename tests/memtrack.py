"""Measure memory of real torch work on the CPU: saved-for-backward tensors and live-storage peak.

Used by tests to check the analytic memory model against what torch really keeps. No GPU:
the tracker watches every tensor storage an op creates (TorchDispatchMode) and releases it
when the storage is freed (weakref finalizer), giving the peak of bytes alive at once.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Peak bytes of storages created inside the `with` block and alive at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._seen or st.nbytes() == 0:
            return
        self._seen.add(key)
        n = st.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._release, key, n)

    def _release(self, key: int, n: int) -> None:
        self._seen.discard(key)
        self.live -= n

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t)
        return out


class SavedBytes:
    """Bytes of distinct storages autograd saves for backward inside the block, parameters excluded."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in (model.parameters() if model else [])}
        self._storages: dict[int, int] = {}

    def _pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self._params and st.nbytes() > 0:
            self._storages[ptr] = st.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self._storages.values())

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


class NewBytes(LiveBytes):
    """LiveBytes that counts only storages an op allocates: never a view (a weight's transpose in
    a linear is a view of the parameter, made before the block), nor the result of an in-place op
    or an `out=` op, which writes into a storage one of its inputs brought (a buffer DeepSpeed
    made before the block and fills again, such as ZeRO's gradient partition)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().data_ptr() not in given:
                self._track(t)
        return out


class ActivationPeak(NewBytes):
    """LiveBytes for a whole training step in an engine: the peak of new storages alive at once
    with the parameters' gradients set apart (the memory model counts them as gradients, not
    activations)."""

    def __init__(self, params) -> None:
        super().__init__()
        self.grad_keys: set[int] = set()
        self.grad_live = 0
        self.grad_peak = 0  # gradient bytes alive at once
        self.activation_peak = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad) for p in params if p.requires_grad]

    def _grad(self, p: torch.Tensor) -> None:
        st = p.grad.untyped_storage()
        if id(st) in self._seen and id(st) not in self.grad_keys:
            self.grad_keys.add(id(st))
            self.grad_live += st.nbytes()
            self.grad_peak = max(self.grad_peak, self.grad_live)

    def _release(self, key: int, n: int) -> None:
        super()._release(key, n)
        if key in self.grad_keys:
            self.grad_keys.discard(key)
            self.grad_live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.activation_peak = max(self.activation_peak, self.live - self.grad_live)
        return out

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        return super().__exit__(*exc)
