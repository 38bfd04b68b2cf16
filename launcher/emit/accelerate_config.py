"""An accelerate config (YAML) equivalent to the plan, for users who launch with `accelerate launch`.

ZeRO and AutoTP plans point accelerate's DeepSpeed plugin at the run directory's ds_config.json
by its absolute path (accelerate resolves a relative one against the directory it is started
from), and say nothing the DeepSpeed file says: accelerate refuses `mixed_precision` beside a
`deepspeed_config_file`. Pipeline plans (pp > 1) run one process per data-parallel replica, each
loading the model with device_map.json. A multi-node file names the rendezvous host as the main
process address (without one, every node waits on "None"); each node passes its own
`--machine_rank`. Written by hand (no YAML library on the planning path); values are quoted JSON
strings, which YAML reads as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.hardware import ClusterSpec
from launcher.spec import TrainSpec

MIXED = {"bf16": "bf16", "bf16-pure": "bf16", "bf16-autocast": "bf16", "fp16": "fp16", "fp32": "no"}
DEFAULT_PORT = 29500


def accelerate_config(
    spec: TrainSpec, cluster: ClusterSpec, dp: int, run_dir: Path, endpoint: str | None = None
) -> str:
    processes = dp * spec.tp if spec.pp == 1 else dp
    host, _, port = (endpoint or "").rpartition(":")
    lines = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED" if spec.pp == 1 else ("MULTI_GPU" if processes > 1 else "NO"),
        "num_machines": cluster.nodes,
        "num_processes": processes,
        "machine_rank": 0,
        "main_process_ip": host or None,
        "main_process_port": int(port) if port else DEFAULT_PORT,
        "rdzv_backend": "static",
        "same_network": True,
        "mixed_precision": MIXED[spec.precision] if spec.pp > 1 else None,
        "use_cpu": False,
        "main_training_function": "main",
    }
    out = [f"# written for {run_dir}: after moving the run directory, change deepspeed_config_file below"]
    if cluster.nodes > 1:
        out.append(
            f"# {cluster.nodes} nodes: on node N run `accelerate launch --config_file THIS --machine_rank N ...`"
            + ("" if host else "; give --main_process_ip (node 0's address): none was known when this was written")
        )
    out += [f"{k}: {json.dumps(v)}" for k, v in lines.items() if v is not None]
    if spec.pp == 1:
        out += [
            "deepspeed_config:",
            f"  deepspeed_config_file: {json.dumps(str(Path(run_dir) / 'ds_config.json'))}",
            f"  zero3_init_flag: {json.dumps(spec.zero_stage == 3)}",
            '  deepspeed_multinode_launcher: "standard"',
        ]
    else:
        out.append(
            "# pipeline plan: load the model with from_pretrained(device_map=json.load(open('device_map.json')))"
        )
    return "\n".join(out) + "\n"
