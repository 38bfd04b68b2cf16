"""Bytes of tensor storages alive at once, by category, with the breakdown at the peak.

A TorchDispatchMode sees every storage an op creates; a weakref finalizer sees it freed. Under
FakeTensorMode nothing is allocated but storages still have sizes and lifetimes, so the peak is
what a real step would hold (allocator rounding and fragmentation excluded: that is the
analytic model's allocator margin). Storages are labelled by the harness (weights, master
weights, gradients, optimizer states, ZeRO buffers) or by the phase that created them
(activations, logits_loss); a label can change (a backward temporary becomes a gradient).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class CategoryTracker(TorchDispatchMode):
    def __init__(self, uncounted: tuple[str, ...] = ()) -> None:
        super().__init__()
        # labels kept track of but not part of the device's memory (ZeRO-3's full parameters,
        # which exist here only so that the model can run; their partitions are counted instead)
        self.uncounted = set(uncounted)
        self.phase = "activations"  # label of storages ops create now
        self.live: dict[str, int] = {}
        self.total = 0
        self.peak = 0
        self.peak_breakdown: dict[str, int] = {}
        self.peak_phase = ""
        self.moment = ""  # where the step is (forward, backward, optimizer step)
        self._label: dict[int, tuple[str, int]] = {}

    # -- labelling -------------------------------------------------------------------------
    def add(self, t: torch.Tensor, category: str, relabel: bool = True) -> None:
        """Count a tensor's storage under `category` (relabel it if already counted)."""
        st = t.untyped_storage()
        key, n = id(st), st.nbytes()
        if key in self._label:
            old, n_old = self._label[key]
            if relabel and old != category:
                self.live[old] -= n_old
                self.live[category] = self.live.get(category, 0) + n_old
                self._label[key] = (category, n_old)
                self.total += n_old * ((old in self.uncounted) - (category in self.uncounted))
                self._update_peak()
            return
        if n == 0:
            return
        self._label[key] = (category, n)
        self.live[category] = self.live.get(category, 0) + n
        if category not in self.uncounted:
            self.total += n
        weakref.finalize(st, self._release, key)
        self._update_peak()

    def add_bytes(self, key: object, n: int, category: str) -> None:
        """Count `n` bytes no tensor holds (kept until `release_bytes(key)`): buffers a harness
        lays out without running an op, which checkpointing would otherwise record and replay."""
        self._label[("bytes", key)] = (category, n)
        self.live[category] = self.live.get(category, 0) + n
        self.total += n
        self._update_peak()

    def release_bytes(self, key: object) -> None:
        self._release(("bytes", key))

    def _release(self, key) -> None:
        label = self._label.pop(key, None)
        if label is not None:
            self.live[label[0]] -= label[1]
            if label[0] not in self.uncounted:
                self.total -= label[1]

    def _update_peak(self) -> None:
        if self.total > self.peak:
            self.peak = self.total
            self.peak_breakdown = self.current()
            self.peak_phase = self.moment

    def current(self) -> dict[str, int]:
        return {k: v for k, v in self.live.items() if v and k not in self.uncounted}

    # -- every op --------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t, self.phase, relabel=False)
        return out
