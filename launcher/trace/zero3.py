"""ZeRO-3 parameter gathering over fake ranks, by DeepSpeed's rules, for the traced step.

The traced model keeps its full parameters (so that it can run); the tracker does not count
them ("unsharded_weights"). What a ZeRO-3 rank holds instead is counted: its 1/dp partition
(by the step harness) and the parameters it has gathered, following DeepSpeed 0.19's
PartitionedParameterCoordinator (runtime/zero/partitioned_param_coordinator.py):
  * the first step records the order in which modules fetch their parameters and releases
    each module's parameters after use;
  * from the second step on, a fetch also prefetches the next not-yet-gathered parameters of
    the recorded order, up to the prefetch bucket per fetch and `max_live` gathered in all;
    the queue of upcoming uses is consumed as it goes, skipping gathered parameters for free;
  * a module's parameters are released after its forward / backward unless they were
    prefetched for a later use, or are used again within `reuse_distance` elements;
  * parameters smaller than the persistence threshold stay gathered throughout.
"""

from __future__ import annotations

from collections import deque

import torch  # only the trace's subprocess (step.py) imports this module


class Zero3Gather:
    def __init__(
        self, model, tracker, *, prefetch: int, persistence: int, reuse_distance: int, max_live: int
    ):
        self.tracker = tracker
        self.prefetch = prefetch
        self.persistence = persistence
        self.reuse_distance = reuse_distance
        self.max_live = max_live
        self.live: dict[int, object] = {}  # id(param) -> the parameter, while gathered
        self.n_live = 0  # elements gathered (persistent ones not counted, as in DeepSpeed)
        self.modules: dict[int, tuple] = {}
        self.order: list[tuple] = []  # params of each fetch, in order (recorded in step 1)
        self.recording = True
        self.step_id = 0
        self.queue: deque = deque()
        self.fetched_for: dict[int, int] = {}  # id(param) -> latest use it was fetched for
        # id(module) -> [input gradients still to come] of its latest forward, None if none will
        self.pending: dict[int, list[int] | None] = {}
        for m in model.modules():
            params = tuple(m.parameters(recurse=False))
            if not params:
                continue
            self.modules[id(m)] = params
            m.register_forward_pre_hook(self._on_fetch)
            m.register_forward_hook(self._on_release)
            # backward: as DeepSpeed hooks it, with identity autograd functions on the module's
            # inputs and outputs (module full-backward hooks hand out views, which models that
            # modify a module's output in place, falcon's, cannot take)
            m.register_forward_pre_hook(self._watch_inputs)
            m.register_forward_hook(self._watch_outputs)
            for p in params:
                if self._persistent(p):
                    self._gather(p)

    # -- the step ----------------------------------------------------------------------------
    def start_step(self) -> None:
        self.step_id = 0
        self.fetched_for = {}
        self.queue = deque((p, step) for step, params in enumerate(self.order) for p in params)

    def end_recording(self) -> None:
        self.recording = False

    # -- gathering ---------------------------------------------------------------------------
    def _persistent(self, p) -> bool:
        return p.numel() < self.persistence

    def _gather(self, p) -> None:
        # counted as bytes, not allocated as a tensor: an allocation inside a checkpointed
        # block would be recorded by selective checkpointing and replayed in its recompute
        if id(p) in self.live:
            return
        self.tracker.add_bytes(("zero3", id(p)), p.numel() * p.element_size(), "zero_buffers")
        self.live[id(p)] = p
        if not self._persistent(p):
            self.n_live += p.numel()

    def _free(self, p) -> None:
        if self.live.pop(id(p), None) is not None:
            self.tracker.release_bytes(("zero3", id(p)))
            self.n_live -= p.numel()

    def _on_fetch(self, module, *_) -> None:
        params = self.modules[id(module)]
        if self.recording:
            self.order.append(params)
        for p in params:
            self._gather(p)
        if not self.recording:
            self._consume_own(params)
            self._prefetch()
        self.step_id += 1

    def _consume_own(self, params) -> None:
        """Pop this fetch's own uses off the queue (unless an earlier prefetch already did)."""
        pending = {id(p) for p in params if self.fetched_for.get(id(p), -1) < self.step_id}
        while self.queue and pending:
            p, step = self.queue.popleft()
            self.fetched_for[id(p)] = step
            pending.discard(id(p))

    def _prefetch(self) -> None:
        budget = min(self.max_live - self.n_live, self.prefetch)
        taken = 0
        chosen: list = []
        while self.queue and taken < budget:
            p, step = self.queue.popleft()
            self.fetched_for[id(p)] = max(self.fetched_for.get(id(p), -1), step)
            if id(p) not in self.live and all(q is not p for q in chosen):
                chosen.append(p)
                taken += p.numel()
        for p in chosen:
            self._gather(p)

    # -- backward triggers ---------------------------------------------------------------------
    def _watch_inputs(self, module, inputs):
        """Release the module's parameters once the gradients of all its inputs are computed."""
        watched = [t for t in _tensors(inputs) if t.requires_grad]
        if not watched or not torch.is_grad_enabled():
            self.pending[id(module)] = None  # nothing to wait for: released with the output's gradient
            return None
        counter = self.pending[id(module)] = [len(watched)]

        def done():
            counter[0] -= 1
            if counter[0] == 0:
                self._on_release(module)

        return _map_tensors(inputs, lambda t: _Identity.apply(t, done) if t.requires_grad else t)

    def _watch_outputs(self, module, inputs, outputs):
        """Fetch the module's parameters when the first gradient reaches one of its outputs."""
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in _tensors(outputs)):
            return None
        fired = [False]
        release_too = self.pending.get(id(module)) is None

        def fetch():
            if not fired[0]:
                fired[0] = True
                self._on_fetch(module)
                if release_too:
                    self._on_release(module)

        return _map_tensors(outputs, lambda t: _Identity.apply(t, fetch) if t.requires_grad else t)

    # -- releasing ---------------------------------------------------------------------------
    def _on_release(self, module, *_) -> None:
        params = [p for p in self.modules[id(module)] if not self._persistent(p)]
        if not self.recording:
            keep = self._reused_soon()
            params = [
                p for p in params if id(p) not in keep and self.fetched_for.get(id(p), -1) <= self.step_id
            ]
        for p in params:
            self._free(p)

    def _reused_soon(self) -> set[int]:
        soon: set[int] = set()
        traversed = 0
        for params in self.order[self.step_id :]:
            if traversed >= self.reuse_distance:
                break
            for p in params:
                soon.add(id(p))
                traversed += p.numel()
        return soon


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _map_tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value  # dicts and model-output objects pass through (DeepSpeed warns, we skip)


class _Identity(torch.autograd.Function):
    """Passes a tensor through (detached, so in-place edits of it are fine) and runs a callback
    when its gradient comes back, as DeepSpeed's Pre/PostBackwardFunction do."""

    @staticmethod
    def forward(ctx, t, callback):
        ctx.callback = callback
        return t.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return grad, None
