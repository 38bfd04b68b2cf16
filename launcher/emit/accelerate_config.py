"""An accelerate config (YAML) equivalent to the plan, for users who launch with `accelerate launch`.

ZeRO and AutoTP plans point accelerate's DeepSpeed plugin at the run directory's
ds_config.json (the single source of the batch, precision and sharding settings); pipeline plans
(pp > 1) run one process per data-parallel replica, each loading the model with device_map.json.
Written by hand (no YAML library on the planning path); values are quoted JSON strings, which
YAML reads as they are.
"""

from __future__ import annotations

import json

from launcher.hardware import ClusterSpec
from launcher.spec import TrainSpec

MIXED = {"bf16": "bf16", "bf16-pure": "bf16", "fp16": "fp16", "fp32": "no"}


def accelerate_config(spec: TrainSpec, cluster: ClusterSpec, dp: int, port: int = 29500) -> str:
    processes = dp * spec.tp if spec.pp == 1 else dp
    lines = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED" if spec.pp == 1 else ("MULTI_GPU" if processes > 1 else "NO"),
        "num_machines": cluster.nodes,
        "num_processes": processes,
        "machine_rank": 0,
        "main_process_port": port,
        "rdzv_backend": "c10d" if cluster.nodes > 1 else "static",
        "same_network": True,
        "mixed_precision": MIXED[spec.precision],
        "use_cpu": False,
        "main_training_function": "main",
    }
    out = [f"{k}: {json.dumps(v)}" for k, v in lines.items()]
    if spec.pp == 1:
        out += [
            "deepspeed_config:",
            '  deepspeed_config_file: "ds_config.json"',
            f"  zero3_init_flag: {json.dumps(spec.zero_stage == 3)}",
            '  deepspeed_multinode_launcher: "standard"',
        ]
    else:
        out.append(
            "# pipeline plan: load the model with from_pretrained(device_map=json.load(open('device_map.json')))"
        )
    return "\n".join(out) + "\n"
