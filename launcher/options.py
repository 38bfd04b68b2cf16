"""Command-line options shared by `estimate`, `plan` and launching, and their conversion into
the typed inputs (ModelArch, ClusterSpec, TrainSpec). Argument parsing only: no planning here."""

from __future__ import annotations

import argparse
import math
import re

from launcher import spec as S
from launcher.errors import InvalidSpecError
from launcher.rundir import SHARD_SIZE


def _parser(kind: type, allow_zero: bool):
    """An argparse `type=` that accepts finite numbers > 0 (or >= 0), with a one-line error."""
    noun = "whole number" if kind is int else "number"
    want = f"a {noun} >= 0" if allow_zero else f"a positive {noun}"

    def parse(text: str):
        try:
            value = int(text, 10) if kind is int else float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value

    parse.__name__ = f"{'non_negative' if allow_zero else 'positive'}_{kind.__name__}"
    return parse


def shard_size(text: str) -> str:
    if not re.fullmatch(SHARD_SIZE, text):
        raise argparse.ArgumentTypeError(f"expected a size such as 5GB, 500MB or 2GiB, got {text!r}")
    return text


def at_most(parse, limit, what: str = ""):
    """`parse`, and at most `limit` (or below it, for a float limit given as an open bound)."""

    def bounded(text: str):
        value = parse(text)
        if value > limit or (isinstance(limit, float) and value >= limit):
            bound = f"below {limit:g}" if isinstance(limit, float) else f"at most {limit:,}"
            raise argparse.ArgumentTypeError(f"expected {bound}{what}, got {text!r}")
        return value

    bounded.__name__ = parse.__name__
    return bounded


def endpoint(text: str) -> str:
    """HOST:PORT for a c10d rendezvous: a host name or IPv4 address (or [IPv6]) and a port 1-65535."""
    host, sep, port = text.rpartition(":")
    ok_host = bool(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]", host))
    if not sep or not ok_host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT (e.g. node001:29500, the first node's address), got {text[:60]!r}"
        )
    return text


positive_int = _parser(int, allow_zero=False)
non_negative_int = _parser(int, allow_zero=True)
positive_float = _parser(float, allow_zero=False)
non_negative_float = _parser(float, allow_zero=True)


def add_model_and_cluster(p: argparse.ArgumentParser, gpus_required: bool = True) -> None:
    g = p.add_argument_group("model and hardware")
    g.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="catalog name (`ftlaunch models`), a Hugging Face hub id in the local cache, "
        "or a path to a config.json / model directory",
    )
    g.add_argument(
        "--gpus",
        required=gpus_required,
        metavar="G",
        help="cluster shape: 8xA100, A100-40GB, 2x8xH100-80GB, 4xL40S ... (`ftlaunch gpus` lists types)",
    )
    g.add_argument("--gpu-memory", type=positive_float, metavar="GIB", help="override memory per GPU (GiB)")
    g.add_argument(
        "--cpu-memory", type=positive_float, metavar="GIB", help="override host RAM per node (GiB)"
    )
    g.add_argument("--nvme", type=non_negative_float, metavar="GIB", help="override NVMe per node (GiB)")
    g.add_argument(
        "--gpus-per-node", type=positive_int, metavar="N", help="GPUs per node (default per GPU type)"
    )
    g.add_argument(
        "--inter-node-bandwidth", type=positive_float, metavar="GBS", help="override network GB/s per node"
    )
    g.add_argument(
        "--cpu-cores",
        type=positive_int,
        metavar="N",
        help="CPU cores per node (default: the node type's share per GPU); with them its memory bandwidth, "
        "which sets the CPU Adam time of optimizer offload",
    )


def add_training(p: argparse.ArgumentParser, *, search: bool = False) -> None:
    """Training options; with search=True (the planner) the sharding flags are optional pins."""
    g = p.add_argument_group("training method")
    g.add_argument(
        "--method", choices=S.METHODS, default="full", help="full fine-tuning, LoRA or QLoRA (default full)"
    )
    g.add_argument("--lora-r", type=positive_int, metavar="R", help="LoRA rank (default 16)")
    g.add_argument("--lora-alpha", type=positive_int, metavar="A", help="LoRA alpha (default 32)")
    g.add_argument(
        "--lora-targets",
        metavar="NAMES",
        help="comma-separated block linears to adapt (q_proj,v_proj,...) or all-linear (default), plus "
        "embed_tokens and/or lm_head for adapters on the embedding and the LM head (e.g. all-linear,lm_head)",
    )
    g.add_argument("--quant", choices=S.QUANT, help="QLoRA base-weight format (default nf4)")
    g.add_argument(
        "--precision",
        choices=S.PRECISIONS,
        default="bf16",
        help="bf16: 16-bit weights with an fp32 master copy and fp32 states (default); bf16-pure: everything "
        "in bf16; bf16-autocast (LoRA / QLoRA): bf16 frozen base, fp32 adapters and states, no master copy, "
        "matmuls in bf16 under torch.autocast (the PEFT + bitsandbytes recipe); fp16; fp32",
    )
    g.add_argument("--optimizer", choices=S.OPTIMIZERS, default="adamw", help="default adamw")
    g.add_argument(
        "--optimizer-step",
        choices=S.OPTIMIZER_STEPS,
        help="after-backward: one optimizer step over every gradient (default"
        + (" unless the planner finds in-backward is what fits" if search else "")
        + "); in-backward: each parameter stepped inside the backward as its gradient is complete and the "
        "gradient freed at once (torchtune's optimizer_in_bwd): full fine-tuning at ZeRO-0 with fp32 or "
        "bf16-pure and no accumulation, without gradient clipping (its global norm needs every gradient)",
    )
    b = p.add_argument_group("batch and sequence")
    b.add_argument(
        "--micro-batch", type=positive_int, metavar="B", help="sequences per GPU per step (default 1)"
    )
    b.add_argument(
        "--seq-len", type=positive_int, default=2048, metavar="S", help="tokens per sequence (default 2048)"
    )
    b.add_argument(
        "--grad-accum", type=positive_int, metavar="K", help="gradient accumulation steps (default 1)"
    )
    b.add_argument(
        "--global-batch",
        type=positive_int,
        metavar="N",
        help="sequences per optimizer step over all GPUs (sets --grad-accum)",
    )
    b.add_argument("--grad-ckpt", choices=S.GRAD_CKPT, help="activation checkpointing (default none)")
    b.add_argument("--attention", choices=S.ATTENTION, default="sdpa", help="attention kernel (default sdpa)")
    b.add_argument(
        "--loss",
        choices=S.LOSSES,
        help="cross-entropy over the whole micro-batch's logits (full), or 1024 tokens at a time with the LM "
        "head recomputed in backward (chunked: the logits working set of one chunk, for one more head "
        "forward). Default: " + ("the planner's choice" if search else "full"),
    )
    b.add_argument(
        "--packing",
        action="store_true",
        help="concatenate short samples into full --seq-len rows (attention and positions kept within each "
        "sample, the loss unchanged): more real tokens per step on short data; not with --pp > 1",
    )
    b.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile every transformer block (inductor fuses the norms, activations and residual adds "
        "between the matmuls into fewer memory passes): faster steps for a one-time compile at start "
        "(minutes on a large model); the memory plan stays the uncompiled one, which compiled blocks do not "
        "exceed; not with --tp or --pp > 1",
    )
    s = p.add_argument_group("sharding")
    s.add_argument(
        "--zero-stage", type=non_negative_int, metavar="{0,1,2,3}", help="DeepSpeed ZeRO stage (default 0)"
    )
    s.add_argument(
        "--offload-optimizer", choices=S.OFFLOAD, help="ZeRO-Offload of optimizer states (default none)"
    )
    s.add_argument("--offload-params", choices=S.OFFLOAD, help="ZeRO-3 parameter offload (default none)")
    s.add_argument("--tp", type=positive_int, metavar="T", help="tensor-parallel degree (default 1)")
    s.add_argument("--pp", type=positive_int, metavar="P", help="pipeline-parallel degree (default 1)")
    s.add_argument(
        "--hpz",
        type=positive_int,
        metavar="N",
        help="ZeRO++ hierarchical partitioning for ZeRO-3: a second copy of the 16-bit weights sharded over N "
        "ranks (a node's GPUs), so the backward gathers them over the node's links instead of the network; "
        "costs weights / N per GPU. Default: " + ("the planner's choice" if search else "1 (off)"),
    )


def train_spec(args: argparse.Namespace, dp_of: callable | None = None) -> S.TrainSpec:
    """TrainSpec from parsed flags. `dp_of(tp, pp)` gives the data-parallel degree, needed to turn
    --global-batch into an accumulation count."""
    if args.method == "full":
        given = [f for f in ("lora_r", "lora_alpha", "lora_targets", "quant") if getattr(args, f) is not None]
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise InvalidSpecError(
                f"{flags} only apply to --method lora or qlora; drop them or pick a method"
            )
    if args.method == "lora" and args.quant is not None:
        raise InvalidSpecError(
            "--quant applies to --method qlora only; use --method qlora to quantise the base weights"
        )
    values = dict(
        method=args.method,
        precision=args.precision,
        optimizer=args.optimizer,
        seq_len=args.seq_len,
        attention=args.attention,
        packing=bool(getattr(args, "packing", False)),
        compile=bool(getattr(args, "compile", False)),
    )
    for name in (
        "lora_r",
        "lora_alpha",
        "lora_targets",
        "quant",
        "micro_batch",
        "grad_accum",
        "grad_ckpt",
        "loss",
        "optimizer_step",
        "zero_stage",
        "offload_optimizer",
        "offload_params",
        "tp",
        "pp",
        "hpz",
    ):
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    spec = S.TrainSpec(**values)
    if args.global_batch is not None and dp_of is not None:
        dp = dp_of(spec.tp, spec.pp)
        per_step = spec.micro_batch * dp
        if args.global_batch % per_step:
            raise InvalidSpecError(
                f"--global-batch {args.global_batch} is not a multiple of micro-batch {spec.micro_batch} x "
                f"data-parallel {dp} = {per_step}; pick a multiple of {per_step}"
            )
        accum = args.global_batch // per_step
        if args.grad_accum is not None and args.grad_accum != accum:
            raise InvalidSpecError(
                f"--global-batch {args.global_batch} means --grad-accum {accum}, not {args.grad_accum}; drop one"
            )
        spec = spec.with_(grad_accum=accum)
    return spec


def cluster_spec(args: argparse.Namespace):
    from launcher.hardware import parse_gpus

    return parse_gpus(
        args.gpus,
        gpu_memory_gib=args.gpu_memory,
        cpu_memory_gib=args.cpu_memory,
        nvme_gib=args.nvme,
        gpus_per_node=args.gpus_per_node,
        inter_node_bandwidth_gbs=args.inter_node_bandwidth,
        cpu_cores=args.cpu_cores,
    )
