#!/usr/bin/env bash
# Every kill / resume / requeue / cancel test N times in a row, in one pytest session (the local
# Slurm and Ray clusters start once). Not part of CI (tests/run.sh): run it on purpose, after
# tests/run.sh has installed .venv, when a fault test is suspected of flaking (issue 24).
#   bash tests/stress.sh        # N=5
#   bash tests/stress.sh 10 -x  # N=10, stop at the first failure (extra arguments go to pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-5}
shift || true
. .venv/bin/activate
python -m pytest -q --repeat "$N" "$@" \
  tests/test_train_faults.py tests/test_chaos.py tests/test_run_safety.py tests/test_resume_resized.py \
  tests/test_resume_exact.py \
  "tests/test_slurm_cluster.py::test_time_limit_signal_checkpoints_requeues_and_resumes_without_losing_a_step" \
  "tests/test_slurm_node_failure.py::test_slurmd_killed_on_a_node_the_job_requeues_and_resumes_from_its_last_checkpoint" \
  "tests/test_slurm_cluster.py::test_requeue_resumes_then_max_requeues_stops_then_launch_resumes_and_cancel_stops" \
  "tests/test_ray_cluster.py::test_sigkill_of_a_rank_restarts_the_group_and_resumes_with_the_same_curve" \
  "tests/test_ray_cluster.py::test_cancel_stops_the_job_and_its_ranks"
