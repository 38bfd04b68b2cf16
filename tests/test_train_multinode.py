"""Two simulated hosts (network namespaces with their own addresses, cluster/netns.sh), one
torchrun agent each, c10d rendezvous, 2 ranks per host: the job trains and all four ranks end
with identical weights."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.backends import torchrun
from launcher.spec import TrainSpec
from tests.runs import ROOT, cpu_env, make_run

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
pytest.importorskip("deepspeed")

HOSTS = {"ftA": ("10.231.0.1", "veth-ftA"), "ftB": ("10.231.0.2", "veth-ftB")}


@pytest.fixture(scope="module")
def two_hosts():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    subprocess.run(["bash", str(ROOT / "cluster" / "netns.sh"), "up"], check=True)
    yield HOSTS
    subprocess.run(["bash", str(ROOT / "cluster" / "netns.sh"), "down"], check=False)


def test_two_hosts_train_and_agree_on_weights(tmp_path: Path, two_hosts):
    spec = TrainSpec(zero_stage=3, micro_batch=2, seq_len=64)
    run_dir, _ = make_run(tmp_path, "twohosts", spec, gpus="2x2xA100", max_steps=6, save_every=3, lr=1e-3)
    endpoint = f"{two_hosts['ftA'][0]}:29400"
    procs = []
    for ns, (addr, dev) in two_hosts.items():
        argv = torchrun.command(
            run_dir,
            2,
            nnodes=2,
            endpoint=endpoint,
            run_id="ftmultinode",
            is_host=ns == "ftA",
            local_addr=addr,
        )
        env = cpu_env()
        # gloo picks its interface from the hostname, which every namespace shares: name it
        env.update(GLOO_SOCKET_IFNAME=dev, MASTER_ADDR=addr)
        log = open(tmp_path / f"{ns}.log", "w")
        procs.append(
            (
                ns,
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, *argv], env=env, stdout=log, stderr=subprocess.STDOUT
                ),
            )
        )
    for ns, p in procs:
        assert p.wait(timeout=300) == 0, (tmp_path / f"{ns}.log").read_text()[-3000:]
    digests = {f.name: f.read_text() for f in (run_dir / "logs").glob("weights-rank-*.sha256")}
    assert len(digests) == 4, digests
    assert len(set(digests.values())) == 1
    assert (run_dir / "output" / "final" / "model.safetensors").exists()
