"""DeepSpeed's handling of the gradients, laid out on fake tensors as launcher/memory/transients.py
counts it (its engine cannot run on fake tensors): what each ZeRO stage keeps of a gradient as it
arrives, what it copies as the backward ends, and the copies it makes to step on.

  ZeRO-0  every gradient stays; after the backward the engine flattens an all-reduce bucket (up to
          5e8 elements plus the tensor that passes them); with fp16/bf16, FP16_Optimizer casts each
          gradient to fp32 and flattens the casts into the gradient of the fp32 master weights.
  ZeRO-1  every gradient stays until the step, except the rank's partition's, which move into a
          partition buffer at the last micro-batch (rank 0 here: the first parameters in order).
  ZeRO-2  each gradient is reduced into the partition buffer (made at the first one) and freed;
          with the optimizer offloaded, each is cloned if larger than the reduce bucket and its
          fp64 norm taken on the GPU, then copied to the host and freed (ZeRO-1: its partition's).
  ZeRO-1/2 at the step: the fp64 norm of one partition piece, then the flattened partition and its
          fp32 cast.
  ZeRO-3  each gradient is reduced into the persistent partition (laid out by the caller), with the
          optimizer offloaded after the fp64 norm of its piece; at the step each sub-group is
          flattened, then cast to fp32.
"""

from __future__ import annotations

import math

from launcher.memory.constants import ALLREDUCE_BUCKET_ELEMENTS


class GradientFlow:
    def __init__(self, torch, spec, tracker, trainable, dp: int, hidden: int) -> None:
        self.torch, self.tracker = torch, tracker
        self.stage = spec.zero_stage
        self.trainable = trainable
        self.offload = spec.offload_optimizer != "none"
        self.mixed = spec.precision in ("fp16", "bf16")
        self.fp16_optimizer = self.stage == 0 and self.mixed
        self.n_train = sum(p.numel() for p in trainable)
        self.gsize = trainable[0].element_size() if trainable else 4
        self.dp = dp
        self.part = math.ceil(self.n_train / (dp if self.stage >= 1 else 1))
        self.largest = max((p.numel() for p in trainable), default=0)
        self.bucket = hidden * hidden  # the reduce bucket the emitter sets
        self.buffer = None  # ZeRO-1/2's partition buffer
        self.boundary = True  # the last micro-batch of the step
        self.in_partition: set[int] = set()
        if self.stage == 1:
            n = 0
            for p in trainable:
                if n >= self.part:
                    break
                self.in_partition.add(id(p))
                n += p.numel()

    def _temp(self, nbytes: float) -> None:
        """A copy DeepSpeed makes and frees at once: counted at the moment it exists."""
        t = self.torch.empty(max(1, math.ceil(nbytes)), dtype=self.torch.uint8)
        self.tracker.add(t, "gradients")
        del t

    def _buffer(self) -> None:
        if self.buffer is None:
            self.buffer = self.torch.empty(max(1, self.part * self.gsize), dtype=self.torch.uint8)
            self.tracker.add(self.buffer, "gradients")

    def arrived(self, p) -> None:
        """A parameter's gradient is complete (post-accumulate hook)."""
        stage = self.stage
        if stage == 3:
            if self.offload:  # the fp64 norm of the rank's piece, in chunks of 2.5e8 elements
                self._temp(8 * min(p.numel() / self.dp, 2.5e8))
            p.grad = None  # reduced into the persistent partition
            return
        if stage == 0 or (stage == 1 and not self.boundary):
            self.tracker.add(p.grad, "gradients")
            return
        if self.offload:  # ZeRO-1/2: to the host piece by piece
            if p.numel() > self.bucket:
                self._temp(p.numel() * self.gsize)
            self._temp(8 * min(p.numel(), self.part))
            if stage == 2 or id(p) in self.in_partition:
                p.grad = None  # copied to the host (ZeRO-1 keeps the other partitions' gradients)
            else:
                self.tracker.add(p.grad, "gradients")
            return
        if stage == 2 or id(p) in self.in_partition:
            self.tracker.add(p.grad, "gradients")
            self._buffer()
            p.grad = None
        else:
            self.tracker.add(p.grad, "gradients")

    def backward_end(self) -> None:
        if self.stage == 0:
            self._temp(min(self.n_train, ALLREDUCE_BUCKET_ELEMENTS + self.largest) * self.gsize)

    def step_gradient(self, part):
        """The gradient the optimizer steps one partition (ZeRO-3: sub-group) on, made as DeepSpeed
        makes it; freed by the caller after the step."""
        torch = self.torch
        if self.fp16_optimizer:
            casts = [torch.empty(p.numel(), dtype=torch.float32) for p in self.trainable if p.grad is not None]
            for c in casts:
                self.tracker.add(c, "gradients")
            g = torch.empty(part.shape, dtype=part.dtype)
            self.tracker.add(g, "gradients")
            del casts
            for p in self.trainable:
                p.grad = None
            return g
        if self.stage in (1, 2):
            for p in self.trainable:
                p.grad = None  # ZeRO-1: the other partitions' gradients
            self._temp(8 * min(self.largest, self.part))  # fp64 norm of one piece
        flat = torch.empty(part.numel() * self.gsize, dtype=torch.uint8)
        self.tracker.add(flat, "gradients")
        if part.dtype.itemsize == self.gsize:
            return flat.view(part.dtype)
        g = torch.empty(part.shape, dtype=part.dtype)
        self.tracker.add(g, "gradients")
        return g

    def step_done(self) -> None:
        self.buffer = None
        for p in self.trainable:
            p.grad = None
