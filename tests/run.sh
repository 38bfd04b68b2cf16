#!/usr/bin/env bash
# Install everything the tests need into .venv and run the whole suite (what CI runs).
#   bash tests/run.sh            # all tests
#   bash tests/run.sh -k planner # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
APT=()
# DeepSpeed's async I/O op (NVMe offload, tests/test_train_e2e.py) builds against libaio
[ -e /usr/include/libaio.h ] || APT+=(libaio-dev)
# tests/test_report.py renders `ftlaunch report`'s page in headless Chromium
command -v chromium >/dev/null || APT+=(chromium)
if [ ${#APT[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing ${APT[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT[@]}" >/dev/null
fi
echo "== installing (torch CPU build first, so nothing pulls a CUDA build)"
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -e ".[train,test,ray,quant,tracking]"
# llm-analysis (compared against in bench/accuracy.py) pins transformers<5 and an old
# huggingface-hub it does not need for offline use: installed without its dependencies
python -m pip install -q --disable-pip-version-check --no-deps llm-analysis==0.2.2
python -m pip install -q --disable-pip-version-check "fire>=0.5"
echo "== ruff"
ruff check launcher tests bench
echo "== DeepSpeed's CPU ops (JIT-built once here, not inside a test's timeout)"
python tests/build_ops.py
# The fast tests, and the slow ones marked one_core (the fake-tensor traces), are one core each:
# two pytest-xdist workers. The other slow and cluster tests run one at a time: each starts several
# ranks that keep both cores busy, and the Slurm and Ray clusters are started once per session.
if [ $# -gt 0 ]; then  # arguments choose the tests: one run with them
  echo "== pytest $*"
  exec python -m pytest -q --durations=25 "$@"
fi
rc=0  # both parts run, whatever the first one gives
echo "== pytest: fast and one-core tests (2 workers)"
python -m pytest -q -n 2 -m "not cluster and (not slow or one_core)" || rc=$?
echo "== pytest: slow and cluster tests"
python -m pytest -q --durations=0 --durations-min=5 -m "(slow or cluster) and not one_core" || rc=$?
exit "$rc"
