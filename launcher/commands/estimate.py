"""`ftlaunch estimate`: the memory of ONE configuration given on the command line."""

from __future__ import annotations

import argparse
import json

from launcher import options
from launcher.memory.estimate import check_parallelism, estimate
from launcher.models.catalog import resolve_model

HELP = "memory per GPU, host RAM and NVMe of one configuration (no search)"
EPILOG = """examples:
  ftlaunch estimate --model llama-3.1-8b --gpus 1xA100-80GB --method lora --micro-batch 4 --seq-len 4096
  ftlaunch estimate --model bloom-176b --gpus 8xA100 --zero-stage 3 --offload-optimizer nvme --offload-params nvme --grad-ckpt full --json
  ftlaunch estimate --model ./my-model/config.json --gpus 2x8xH100-80GB --zero-stage 3 --global-batch 256

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
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    arch = resolve_model(args.model)
    cluster = options.cluster_spec(args)

    def dp_of(tp: int, pp: int) -> int:
        from launcher.spec import TrainSpec

        return check_parallelism(arch, TrainSpec(tp=tp, pp=pp), cluster.world_size)

    spec = options.train_spec(args, dp_of)
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
        print(json.dumps(out, indent=2))
        return 0
    from launcher.render import print_estimate

    print_estimate(arch, spec, cluster, est)
    return 0
