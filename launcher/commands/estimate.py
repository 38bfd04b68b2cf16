"""`ftlaunch estimate`: the memory of ONE configuration given on the command line."""

from __future__ import annotations

import argparse
import json

from launcher import options
from launcher.errors import InvalidSpecError
from launcher.memory.estimate import estimate
from launcher.memory.layout import check_parallelism, check_tp_in_node
from launcher.models.catalog import resolve_model
from launcher.models.hf_families import packing_refusal
from launcher.parallel.split import tensor_parallel_refusal
from launcher.spec import tensor_parallel_conflict

HELP = "memory per GPU, host RAM and NVMe of one configuration (no search)"
EPILOG = """examples:
  ftlaunch estimate --model llama-3.1-8b --gpus 1xA100-80GB --method lora --micro-batch 4 --seq-len 4096
  ftlaunch estimate --model bloom-176b --gpus 8xA100 --zero-stage 3 --offload-optimizer nvme --offload-params nvme --grad-ckpt full --json
  ftlaunch estimate --model ./my-model/config.json --gpus 2x8xH100-80GB --zero-stage 3 --global-batch 256
  ftlaunch estimate --model llama-3.2-3b --gpus 1xA100-80GB --micro-batch 2 --seq-len 4096 --trace

--trace runs one real training step of the configuration on this machine's CPU under
torch's FakeTensorMode (no GPU, no weights: nothing is allocated) and counts every tensor
it keeps, by category, beside the analytic estimate. It needs the train extra (torch,
transformers, peft; bitsandbytes for QLoRA and 8-bit AdamW) and takes seconds for 1B
models, a minute or two for 8B. It traces full/LoRA/QLoRA (nf4, int8), bf16/fp16/fp32,
checkpointing, AdamW/8-bit AdamW/SGD/Adafactor, ZeRO-0/1/2/3 over --gpus data-parallel
ranks; not TP or PP (it says so).

Each term is documented in launcher/memory/ (formula and source). Peak reserved adds the
caching allocator's margin; 'GPU total' adds the CUDA context and NCCL buffers, and is what
must fit in the GPU's memory."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help=HELP,
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_model_and_cluster(p)
    options.add_training(p)
    p.add_argument(
        "--trace",
        action="store_true",
        help="also run one training step under FakeTensorMode on the CPU and compare (see below)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    arch = resolve_model(args.model)
    cluster = options.cluster_spec(args)

    def dp_of(tp: int, pp: int) -> int:
        from launcher.spec import TrainSpec

        return check_parallelism(arch, TrainSpec(tp=tp, pp=pp), cluster.world_size)

    spec = options.train_spec(args, dp_of)
    check_tp_in_node(spec.tp, cluster.gpus_per_node)
    why = tensor_parallel_conflict(spec)
    if why is not None:  # as `plan` refuses it: no run could train this configuration
        raise InvalidSpecError(
            f"--tp {spec.tp} with this configuration: {why}; use --tp 1 (ZeRO shards instead)"
        )
    why = tensor_parallel_refusal(arch.model_type, arch.heads, arch.kv_heads, arch.vocab, spec.tp) if spec.pp > 1 else None
    if why is not None:
        raise InvalidSpecError(f"--tp {spec.tp} with --pp {spec.pp}: {arch.name} {why}; use --tp 1 or --pp 1")
    why = packing_refusal(arch.model_type) if spec.packing else None
    if why is not None:
        raise InvalidSpecError(f"--packing: {why}")
    est = estimate(arch, spec, cluster)
    if args.json:
        out = est.to_dict(cluster)
        out["model"] = {"name": arch.name, "params": arch.total_params}
        out["cluster"] = {
            "gpu": cluster.gpu.name,
            "nodes": cluster.nodes,
            "gpus_per_node": cluster.gpus_per_node,
            "gpu_memory_gib": cluster.gpu_memory_gib,
            "notes": list(cluster.notes),
        }
        out["spec"] = spec.to_dict()
        if args.trace:
            traced = _trace(args, arch, spec, est)
            out["trace"] = traced.to_dict()
            out["trace"]["analytic_error_pct"] = error_pct(est.peak_allocated, traced.peak_allocated)
        print(json.dumps(out, indent=2))
        return 0
    from launcher.render import print_estimate, print_trace

    print_estimate(arch, spec, cluster, est)  # shown before the trace runs (or fails)
    if args.trace:
        traced = _trace(args, arch, spec, est)
        print_trace(est, traced, error_pct(est.peak_allocated, traced.peak_allocated))
    return 0


def _trace(args, arch, spec, est):
    from launcher.trace import trace

    return trace(arch, spec, est.dp, debug=getattr(args, "debug", False))


def error_pct(predicted: float, reference: float) -> float:
    return round(100 * (predicted - reference) / reference, 2)
