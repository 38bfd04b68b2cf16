"""How ranks load the model (launcher/train/model.rank_model), on real ranks (tests/load_probe.py):
under ZeRO-3 every parameter is partitioned as it is created and a checkpoint is read into the
partitions (or a random init run) one module at a time, with exactly the values one rank would
have read or built.
The host RAM a node spends on it is measured by bench/host_loading.py."""

from __future__ import annotations

import hashlib

import pytest

from launcher.models.catalog import CATALOG
from launcher.spec import TrainSpec
from tests.load_probe import measure_loading
from tests.runs import cpu_env, make_run

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow

ZERO3 = TrainSpec(zero_stage=3, micro_batch=2, seq_len=64)


def one_rank_digests(model) -> dict[str, str]:
    return {
        n: hashlib.sha256(p.detach().to(torch.float32).numpy().tobytes()).hexdigest()
        for n, p in model.named_parameters()
    }


def probe(tmp_path, name, **run):
    run_dir, _ = make_run(tmp_path, name, ZERO3, **run)
    got = measure_loading(run_dir, tmp_path / f"{name}-probe", 2, cpu_env(), digest=True)
    for r in got["ranks"]:  # each rank holds half of every parameter (rounded up), never all of it
        assert r["numel"] / 2 <= r["held_numel"] < r["numel"] / 2 + 1000, r
    assert got["ranks"][0]["digests"] == got["ranks"][1]["digests"]
    return got["ranks"][0]["digests"]


def test_zero3_random_init_is_partitioned_from_the_start_with_the_values_of_one_rank(tmp_path):
    from launcher.train.model import build_model

    want = one_rank_digests(build_model(dict(CATALOG["tiny-llama"]), "", ZERO3, "random", 11, 0.0))
    assert probe(tmp_path, "random", seed=11) == want


def test_zero3_reads_a_checkpoint_into_the_partitions_by_name(tmp_path):
    from launcher.train.model import build_model

    ckpt = tmp_path / "checkpoint"
    model = build_model(dict(CATALOG["tiny-llama"]), "", TrainSpec(), "random", 5, 0.0)
    model.save_pretrained(str(ckpt), max_shard_size="200KB")  # several files, each opened per module
    assert probe(tmp_path, "pretrained", model=str(ckpt), init="pretrained") == one_rank_digests(model)
