"""One training step of a configuration under FakeTensorMode, its memory counted by category.

Runs in its own process (`python -m launcher.trace.step`, a JSON request on stdin, a JSON
result on stdout, progress on stderr) because fake tensors, dispatch modes and autograd hooks
must not leak into the caller. The model is the one the worker trains (launcher.train.model.
build_model, random init), built inside FakeTensorMode: shapes and lifetimes are real, nothing
is allocated, so a full-size 3B model traces on a laptop.

What is traced for real: the model's forward and backward as transformers and peft run them
(activations, recomputation under checkpointing, the logits and loss working set, backward
temporaries), LoRA's frozen base weights, parameter dtypes, and torch's optimizer creating and
stepping its states. What is laid out as DeepSpeed lays it out (its engine cannot run on fake
tensors): the fp32 master partition and fp32 gradient copy of mixed precision, ZeRO-1/2/3
partitions over `dp` fake ranks, ZeRO-1/2 reduce buckets, and ZeRO-3's gathering, prefetching and
releasing of parameters (launcher/trace/zero3.py) and reduce-scatter of each gradient as soon
as it is accumulated. Two steps run so that the second sees the optimizer states.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

GIB = 1024**3


def _progress(msg: str) -> None:
    print(f"[trace] {msg}", file=sys.stderr, flush=True)


def _flat(torch, numel: float, dtype, tracker, label: str):
    t = torch.empty(max(1, math.ceil(numel)), dtype=dtype)
    tracker.add(t, label)
    return t


def _no_op_casts(torch, dtype) -> None:
    """Under fake tensors any Module.to() swaps parameters, and swapping a tensor the fake mode
    holds a weak reference to fails, even when nothing changes (torch 2.13). New tensors are
    created in the compute dtype from the start, and casts that change nothing return at once."""
    from itertools import chain

    torch.set_default_dtype(dtype if dtype.is_floating_point else torch.float32)
    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, to_dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        same = all(
            (to_dtype is None or not t.is_floating_point() or t.dtype == to_dtype)
            and (device is None or t.device.type == torch.device(device).type)
            for t in chain(self.parameters(), self.buffers())
        )
        return self if same else original(self, *args, **kwargs)

    torch.nn.Module.to = to


def _unmasked_batches(packed: bool) -> None:
    """Trace the worker's batches: right-padded rows with no attention mask (launcher/train/data.py
    says why). With real tensors transformers sees positions 0..S-1 and no mask and lets sdpa
    apply causality itself (no mask tensor, GQA K/V not expanded); fake tensors look like a
    compiler trace to it, which would materialise a mask and expand K/V in every layer. Give it
    the answer real tensors give."""
    import transformers.masking_utils as masking

    original = masking._ignore_causal_mask_sdpa

    def ignore_causal_mask(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        if padding_mask is not None:
            return original(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)
        if local_attention_size is not None and kv_length >= local_attention_size:
            return False
        return q_length == 1 or kv_length == q_length

    masking._ignore_causal_mask_sdpa = ignore_causal_mask
    if not packed:  # positions 0..S-1 in every row: one sequence per row, which real tensors reveal
        masking.find_packed_sequence_indices = lambda position_ids: None
    # packed rows (--packing) restart their positions per sample: transformers finds the samples from
    # the fake position ids as from real ones and builds the block-diagonal mask the worker's rows get


def _attention_without_dropout(torch) -> None:
    """CUDA's flash / memory-efficient kernels apply attention dropout inside the kernel (they
    keep only an RNG state); the CPU's flash kernel cannot, and sdpa then falls back to the
    math path that materialises the score matrix. Trace the kernel a GPU runs: no dropout."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def without_dropout(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        return sdpa(query, key, value, attn_mask, 0.0, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = without_dropout


def _dropout_as_on_cuda(torch) -> None:
    """CUDA's dropout is one fused kernel that keeps a 1-byte mask for backward; the CPU's
    multiplies by a noise tensor of the input's dtype and keeps that (2 or 4 bytes). Trace the
    GPU's: the same op CUDA runs (native_dropout), whose mask is boolean on every device."""
    F = torch.nn.functional
    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return original(input, p, training, inplace)
        return torch.ops.aten.native_dropout(input, p, True)[0]

    F.dropout = dropout


def _bitsandbytes_tables(mode) -> None:
    """bitsandbytes builds its quantisation code tables (8-bit blockwise maps) from Python
    numbers, which fake tensors cannot hold; build them for real and hand the fake mode's
    copy to the quantisation ops and 8-bit optimizers that ask (their ops have fake kernels)."""
    import bitsandbytes.functional as F
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    real = F.create_dynamic_map

    def dynamic_map(*args, **kwargs):
        with unset_fake_temporarily():
            table = real(*args, **kwargs)
        return mode.from_tensor(table)

    F.create_dynamic_map = dynamic_map


def trace_step(req: dict) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from launcher.spec import TrainSpec
    from launcher.trace.ds_grads import GradientFlow
    from launcher.trace.tracker import CategoryTracker
    from launcher.trace.zero3 import Zero3Gather
    from launcher.train.model import build_model, torch_dtype

    spec = TrainSpec(**req["spec"])
    dp = int(req.get("dp", 1))
    stage = spec.zero_stage
    shard = dp if stage >= 1 else 1
    mixed = spec.precision in ("fp16", "bf16")
    hf = req["hf_config"]
    hidden = int(req["hidden"])
    t0 = time.monotonic()
    uncounted = ("optimizer_temporaries", "partition_view") + (("unsharded_weights",) if stage == 3 else ())
    tracker = CategoryTracker(uncounted=uncounted)
    _no_op_casts(torch, torch_dtype(spec.precision))
    _unmasked_batches(spec.packing)
    _attention_without_dropout(torch)
    _dropout_as_on_cuda(torch)
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    if spec.method == "qlora" or spec.optimizer == "adamw-8bit":
        _bitsandbytes_tables(mode)
    with mode:
        _progress("building the model on fake tensors")
        model = build_model(hf, "", spec, init="random", seed=0, lora_dropout=0.0)
        model.train()
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        n_train = sum(p.numel() for p in trainable)
        # weights, not storage elements: NF4 packs two (in 16-bit storage four) into one
        n_total = sum(
            math.prod(p.quant_state.shape) if hasattr(p, "quant_state") else p.numel()
            for p in {id(p): p for p in params}.values()
        )
        weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in params}.values())
        gdtype = trainable[0].dtype if trainable else torch.float32
        gsize = torch.empty((), dtype=gdtype).element_size()
        for p in params:
            tracker.add(p, "unsharded_weights" if stage == 3 else "weights")
        for b in model.buffers():
            tracker.add(b, "weights")
        if spec.method == "qlora":  # every rank keeps its layers' quantisation constants whole
            from launcher.train.quantize import quant_constants

            for m in model.modules():
                if hasattr(m, "weight"):
                    for t in quant_constants(m):
                        tracker.add(t, "weights")
        keep: list = []  # harness buffers that live for the whole step
        zero3 = None
        if stage == 3:
            if spec.offload_params == "none":
                keep.append(_flat(torch, weight_bytes / dp, torch.uint8, tracker, "weights"))
            z3 = req["zero3"]
            zero3 = Zero3Gather(
                model,
                tracker,
                prefetch=int(z3["prefetch"]),
                persistence=int(z3["persistence"]),
                reuse_distance=int(z3["reuse_distance"]),
                max_live=int(z3["max_live"]),
            )
        if stage in (1, 2):
            keep.append(_flat(torch, 2 * hidden * hidden * gsize, torch.uint8, tracker, "zero_buffers"))
        if stage == 3:
            keep.append(_flat(torch, hidden * hidden * gsize, torch.uint8, tracker, "zero_buffers"))

        offload_opt = spec.offload_optimizer != "none"
        # What the optimizer steps on: the model's trainable parameters, or the rank's flat
        # partition of them: fp32 master weights under mixed precision, in ZeRO-3's sub-groups;
        # without mixed precision a view into DeepSpeed's flattened weights (not counted again).
        if mixed or shard > 1:
            dtype = torch.float32 if mixed else gdtype
            n_part = math.ceil(n_train / shard)
            size = min(n_part, int(req["sub_group"])) if stage == 3 else n_part
            parts = [
                torch.nn.Parameter(torch.empty(min(size, n_part - i), dtype=dtype))
                for i in range(0, max(n_part, 1), max(size, 1))
            ]
            label = "master_weights" if mixed and not offload_opt else "partition_view"
            for part in parts:
                tracker.add(part, label)
            opt_params = parts
        else:
            parts = []
            opt_params = trainable
        in_backward = spec.optimizer_step == "in-backward"  # ZeRO-0, so opt_params are the model's
        opt = None if in_backward else _optimizer(torch, spec, opt_params)
        inner = {id(p): _optimizer(torch, spec, [p]) for p in trainable} if in_backward else {}
        waiting: list = []  # in backward: gradients waiting for their all-reduce (in_backward.py)
        flow = GradientFlow(torch, spec, tracker, trainable, dp, hidden)  # DeepSpeed's (ds_grads.py)
        if stage == 3 and not offload_opt:  # the reduced gradient partition, made once
            keep.append(_flat(torch, n_train / dp * gsize, torch.uint8, tracker, "gradients"))

        def drain():
            phase, moment = tracker.phase, tracker.moment
            tracker.phase = "optimizer_temporaries"
            for q in waiting:
                inner[id(q)].step()
                _count_states(tracker, inner[id(q)])
                q.grad = None
            waiting.clear()
            tracker.phase, tracker.moment = phase, moment

        def on_grad(p):
            if p.grad is None:
                return
            if in_backward:  # stepped and freed once the bucket of hidden² elements is full
                tracker.add(p.grad, "gradients")
                waiting.append(p)
                if dp == 1 or sum(q.numel() for q in waiting) >= hidden * hidden:
                    drain()
            else:
                flow.arrived(p)

        for p in trainable:
            p.register_post_accumulate_grad_hook(on_grad)
        head = model.get_output_embeddings()

        def logits_phase(*_):
            tracker.phase = "logits_loss"

        head.register_forward_pre_hook(logits_phase)

        def blocks_phase(*_):
            tracker.phase = "activations"

        # backward through the loss and the LM head makes logits-sized temporaries: logits_loss;
        # from the head's input gradient on, backward temporaries count as activations
        head.register_full_backward_hook(blocks_phase)

        ids = torch.randint(0, int(req["vocab"]), (spec.micro_batch, spec.seq_len))
        inputs = {"input_ids": ids, "labels": ids}
        if spec.packing:  # three samples a row, each with its own positions (no cache: transformers packs only so)
            cut = [spec.seq_len // 2, spec.seq_len // 4, spec.seq_len - spec.seq_len // 2 - spec.seq_len // 4]
            pos = torch.cat([torch.arange(n) for n in cut if n]).repeat(spec.micro_batch, 1)
            inputs.update(position_ids=pos, use_cache=False)
        moments: dict[str, int] = {}
        micro_batches = min(spec.grad_accum, 2)
        with tracker:
            for step in (1, 2):
                if zero3 is not None:
                    zero3.start_step()
                for micro in range(micro_batches):  # gradients accumulate over the second
                    _progress(f"step {step}: forward" + (f" (micro-batch {micro + 1})" if micro else ""))
                    tracker.phase, tracker.moment = "activations", "forward"
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.precision == "bf16-autocast"):
                        loss = model(**inputs).loss  # (DeepSpeed's torch_autocast)
                    _progress(f"step {step}: backward")
                    tracker.phase, tracker.moment = "logits_loss", "backward"
                    moments[f"step {step}.{micro + 1} backward start"] = tracker.total
                    flow.boundary = micro == micro_batches - 1
                    loss.backward()
                    del loss
                secondary = None
                if not in_backward:
                    tracker.phase, tracker.moment = "gradients", "backward end"
                    if stage == 3 and spec.hpz > 1:  # ZeRO++ hpZ's secondary weight shards, made
                        # as the backward released each module (here at its end), kept to the step
                        secondary = _flat(torch, weight_bytes / spec.hpz, torch.uint8, tracker, "weights")
                    flow.backward_end()
                # DeepSpeed's fused Adam updates in place; torch's single-tensor AdamW makes
                # parameter-sized temporaries: not counted, the states it keeps are
                tracker.phase, tracker.moment = "optimizer_temporaries", "optimizer step"
                _progress(f"step {step}: optimizer step")
                if parts and not offload_opt:
                    for part in parts:  # one partition (ZeRO-3: sub-group) at a time
                        g = flow.step_gradient(part)
                        part.grad = g
                        opt.step()
                        _count_states(tracker, opt)
                        part.grad = None
                        del g
                elif in_backward:
                    drain()  # the last bucket
                elif not parts:
                    opt.step()
                    _count_states(tracker, opt)
                flow.step_done()
                del secondary  # DeepSpeed drops them after the step (invalidate_secondary_tensor)
                if zero3 is not None:
                    zero3.end_recording()
    return {
        "peak_bytes": tracker.peak,
        "peak_phase": tracker.peak_phase,
        "peak_breakdown": tracker.peak_breakdown,
        "moments": moments,
        "params_total": n_total,
        "params_trainable": n_train,
        "seconds": round(time.monotonic() - t0, 1),
        "torch": torch.__version__,
    }


def _count_states(tracker, opt) -> None:
    for state in opt.state.values():
        for v in state.values():
            if hasattr(v, "untyped_storage") and v.dim() > 0:
                tracker.add(v, "optimizer_states")


def _optimizer(torch, spec, params):
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if spec.optimizer == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=1e-4)  # as the worker builds it (launcher/train/loop.py)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=False)
    if spec.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, relative_step=False, scale_parameter=False)
    raise ValueError(f"cannot trace optimizer {spec.optimizer}")


def main() -> int:
    req = json.loads(sys.stdin.read())
    try:
        out = trace_step(req)
    except Exception as exc:  # reported to the parent as one line; traceback under --debug
        if os.environ.get("FTLAUNCH_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        print(json.dumps({"error": f"{type(exc).__name__}: {first}"}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
