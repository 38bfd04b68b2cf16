"""Turn a plan into the files of its run directory (launcher/rundir.py describes them)."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

from launcher import program
from launcher.backends import accelerate_launch, torchrun
from launcher.emit import hf_trainer
from launcher.emit.accelerate_config import accelerate_config
from launcher.emit.deepspeed import ds_config
from launcher.emit.device_map import device_map
from launcher.rundir import RunFile, TrainingConfig, new_run_file, write_run_dir


def run_file(
    name,
    arch,
    source,
    spec,
    cluster,
    dp,
    global_batch,
    plan_dict,
    training: TrainingConfig,
    max_restarts: int = 2,
    slurm=None,
    ray: dict | None = None,
    program_entry=None,
) -> RunFile:
    """plan.json's content; `slurm` (backends.slurm_script.SlurmOptions) makes it a Slurm run, `ray`
    (address, storage, cpu: see backends/ray.py) a Ray run; `program_entry` (rundir.Program) runs
    the user's program instead of ftlaunch's worker."""
    backend = {
        "name": "slurm" if slurm is not None else "ray" if ray is not None else "torchrun",
        "nproc_per_node": cluster.gpus_per_node,
        "nnodes": cluster.nodes,
        "max_restarts": max_restarts,
    }
    if slurm is not None:
        backend["slurm"] = slurm.model_dump()
    if ray is not None:
        backend["ray"] = ray
    return new_run_file(
        name=name,
        model={"name": arch.name, "source": source, "hf_config": copy.deepcopy(arch.hf_config)},
        spec=spec.to_dict(),
        cluster={
            "gpu": cluster.gpu.name,
            "nodes": cluster.nodes,
            "gpus_per_node": cluster.gpus_per_node,
            "gpu_memory_gib": cluster.gpu_memory_gib,
        },
        dp=dp,
        global_batch=global_batch,
        plan=plan_dict,
        training=training,
        backend=backend,
        program=program_entry,
    )


def write(
    root: Path,
    run: RunFile,
    arch,
    spec,
    cluster,
    explain: str,
    env: dict[str, str] | None = None,
    endpoint: str | None = None,
    nvme_path: str = "/local_nvme",
    replan: bool = False,
) -> tuple[Path, list[str]]:
    """Write the run directory (an existing one only with `replan`: rundir.write_run_dir); returns
    it and the exact launch command."""
    run_dir = (Path(root) / run.name).resolve()
    ds = ds_config(
        arch, spec, run.dp, lr=run.training.lr, weight_decay=run.training.weight_decay, nvme_path=nvme_path
    )
    files = {
        "ds_config.json": json.dumps(ds, indent=2) + "\n",
        "accelerate_config.yaml": accelerate_config(spec, cluster, run.dp, run_dir, endpoint),
        "explain.txt": explain,
    }
    vals = program.values(run_dir, spec, ds, run.training)
    if vals[program.HF_ARGS] is not None:  # pp 1: the Trainer does not drive DeepSpeed's pipeline engine
        files[hf_trainer.CONFIG] = json.dumps(hf_trainer.trainer_ds_config(ds), indent=2) + "\n"
        files[hf_trainer.ARGS] = shlex.join(vals[program.HF_ARGS]) + "\n"
    if spec.pp > 1:
        dm = device_map(arch, spec, spec.pp)
        files["device_map.json"] = json.dumps(dm.device_map, indent=2) + "\n"  # the map alone: from_pretrained's
        files["device_map_stages.json"] = json.dumps(dm.stages_dict(), indent=2) + "\n"
    env = {**(env or {}), **program.env(run_dir)}
    words, workdir, launcher = None, None, "torchrun"
    if run.program is not None:
        words = program.words(run.program, vals)
        workdir, launcher = run.program.workdir, run.program.launcher
    restarts = run.backend.get("max_restarts", 0)
    if launcher == "accelerate":
        argv = accelerate_launch.command(
            run_dir, cluster.gpus_per_node, cluster.nodes, words, endpoint=endpoint, max_restarts=restarts
        )
    else:
        argv = torchrun.command(
            run_dir,
            cluster.gpus_per_node,
            cluster.nodes,
            endpoint=endpoint,
            max_restarts=restarts,
            run_id=run.name,
            program=words,
        )
    files["launch.sh"] = torchrun.script(argv, env, run_dir, workdir)
    if run.backend.get("name") == "slurm":
        from launcher.backends import slurm_script

        files[slurm_script.SCRIPT] = slurm_script.render(
            run_dir,
            run.name,
            cluster.nodes,
            cluster.gpus_per_node,
            restarts,
            env,
            slurm_script.SlurmOptions(**run.backend["slurm"]),
            program=words,
            workdir=workdir,
            launcher=launcher,
        )
    if run.backend.get("name") == "ray":
        from launcher.backends import ray_request

        files.update(ray_request.files(run_dir, run))
    write_run_dir(root, run, files, executable=("launch.sh",), replan=replan)
    return run_dir, argv
