"""Pipeline and 3D plans as Slurm jobs on the local two-node cluster (cluster/slurm_up.sh): the
stages split across the nodes (activations cross between them), TP inside each node; each trains
the curve of the same plan under torchrun on one host, bitwise."""

from __future__ import annotations

import pytest

from launcher.backends import slurm
from tests.runs import assert_pipeline_export, assert_same_curve
from tests.test_slurm_cluster import curve, ft, job_id, wait_state, write_run

pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

PIPELINE = [
    *("--model", "tiny-llama", "--cpu", "--init", "random", "--zero-stage", "1", "--pp", "2"),
    *("--micro-batch", "2", "--grad-accum", "4", "--seq-len", "64", "--lr", "1e-3", "--max-restarts", "0"),
    *("--max-steps", "6", "--save-every", "3"),
]


def slurm_then_torchrun(tmp_path, name: str, argv: list[str], nodes_gpus: str, one_host: str, capsys) -> None:
    """The plan as a Slurm job across the two nodes completes and exports one model per stage
    file; the same plan under torchrun on one host trains the same curve, bitwise."""
    run_dir = write_run(tmp_path, name, [*argv, "--backend", "slurm", "--gpus", nodes_gpus], capsys)
    assert ft("launch", str(run_dir), "--detach", "--skip-preflight", capsys=capsys) == 0
    st = wait_state(run_dir, ("COMPLETED", "FAILED", "CANCELLED", "PREEMPTED"))
    log = slurm.log_path(run_dir, job_id(run_dir)).read_text()
    assert st["state"] == "COMPLETED", log[-3000:]
    assert sorted(curve(run_dir)) == list(range(1, 7))
    assert_pipeline_export(run_dir / "output" / "final", 2)
    local = write_run(tmp_path, f"{name}-local", [*argv, "--backend", "torchrun", "--gpus", one_host], capsys)
    assert ft("launch", str(local), "--skip-preflight", capsys=capsys) == 0
    assert_same_curve(curve(run_dir), curve(local))


def test_a_pipeline_job_with_one_stage_per_node_completes_with_the_curve_of_one_node(
    slurm_cluster, tmp_path, capsys, cpu
):
    # 2 nodes x 1 rank: stage 0 on the first node, stage 1 on the second, activations between them
    slurm_then_torchrun(tmp_path, "pipe", PIPELINE, "2x1xA100", "1x2xA100", capsys)


def test_a_3d_job_with_tensor_parallelism_inside_each_node_and_one_stage_per_node_completes(
    slurm_cluster, tmp_path, capsys, cpu
):
    # 2 nodes x 2 ranks, tp 2 x pp 2: each node's two ranks split one stage's heads and vocabulary
    # (their all-reduces stay inside the node), the activations cross between the nodes
    slurm_then_torchrun(tmp_path, "tp-pipe", [*PIPELINE, "--tp", "2"], "2x2xA100", "1x4xA100", capsys)
