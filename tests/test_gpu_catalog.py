"""The GPU catalog (launcher/gpus.py) and the per-GPU node defaults (launcher/hardware.py): every entry
sane, the anchor figures right."""

from __future__ import annotations

import dataclasses
import math

import pytest

from launcher.errors import InvalidSpecError
from launcher.gpus import GPUS, GpuType, list_gpus, resolve_gpu
from launcher.hardware import NodeSpec, default_node

REQUIRED = [
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H100-96GB",
    "H200",
    "V100-16GB",
    "V100-32GB",
    "A10",
    "L4",
    "T4",
    "L40S",
    "RTX3090",
    "RTX4090",
    "RTX-A6000",
    "MI300X",
    "H100-NVL",
    "GH200",
    "A40",
    "L40",
    "RTX-A5000",
    "RTX6000-Ada",
    "MI250X",
    "MI325X",
]


def test_catalog_has_the_required_gpus() -> None:
    assert set(REQUIRED) <= set(GPUS)
    assert list_gpus() == list(GPUS.values())
    assert all(GPUS[g.name] is g for g in list_gpus())


def test_catalog_anchor_figures() -> None:
    assert GPUS["A100-80GB"].memory_gib == pytest.approx(79.15)
    assert GPUS["H100-80GB"].memory_gib == pytest.approx(79.1, abs=0.05)
    assert GPUS["H200"].memory_gib == pytest.approx(139.8)
    assert GPUS["A100-80GB"].peak_bf16_tflops == 312
    assert GPUS["H100-80GB"].peak_bf16_tflops == pytest.approx(989, rel=0.01)
    assert GPUS["MI300X"].vendor == "amd" and GPUS["MI300X"].intra_node_link == "infinity-fabric"
    assert GPUS["H100-80GB"].fp8 and not GPUS["A100-80GB"].fp8
    assert [g.name for g in list_gpus() if not g.bf16] == ["V100-16GB", "V100-32GB", "T4"]


@pytest.mark.parametrize("gpu", list(GPUS.values()), ids=list(GPUS))
def test_catalog_entry_is_sane(gpu: GpuType) -> None:
    assert gpu.vendor in ("nvidia", "amd")
    assert gpu.intra_node_link in ("nvlink", "pcie", "infinity-fabric")
    for value in (
        gpu.memory_gib,
        gpu.peak_bf16_tflops,
        gpu.hbm_bandwidth_gbs,
        gpu.intra_node_bandwidth_gbs,
        gpu.pcie_bandwidth_gbs,
        gpu.price_per_hour_usd,
    ):
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    assert 10 < gpu.memory_gib < 300
    assert 50 <= gpu.peak_bf16_tflops <= 5000
    assert 200 <= gpu.hbm_bandwidth_gbs <= 10_000
    # GH200 reaches host memory over NVLink-C2C (450 GB/s), not PCIe
    c2c = gpu.name == "GH200"
    assert gpu.pcie_bandwidth_gbs <= (450 if c2c else 64) and gpu.intra_node_bandwidth_gbs <= 1000
    assert 0.1 < gpu.price_per_hour_usd < 20
    assert gpu.default_gpus_per_node in (1, 2, 4, 8)
    if gpu.intra_node_link != "pcie" and not c2c:
        assert gpu.intra_node_bandwidth_gbs > gpu.pcie_bandwidth_gbs
    # usable memory is a little under the nominal size the name or datasheet gives
    nominal = {"H200": 141, "B200": 180, "MI300X": 192, "L40S": 48, "RTX-A6000": 48, "T4": 16, "H100-NVL": 94,
               "GH200": 96, "A40": 48, "L40": 48, "RTX6000-Ada": 48, "MI250X": 64, "MI325X": 256}  # fmt: skip
    nominal_gb = nominal.get(gpu.name) or next(
        (float(p[:-2]) for p in gpu.name.split("-") if p.endswith("GB")), 24 if gpu.memory_gib < 25 else 80
    )
    assert 0.9 * nominal_gb * 1e9 / 2**30 < gpu.memory_gib < nominal_gb


@pytest.mark.parametrize("gpu", list(GPUS.values()), ids=list(GPUS))
def test_default_nodes_are_sane(gpu: GpuType) -> None:
    previous: NodeSpec | None = None
    for n in (1, 2, 4, 8, 16):
        node = default_node(gpu, n)
        assert node.gpus_per_node == n
        assert node.cpu_memory_gib >= 64 and node.cpu_cores >= 1 and isinstance(node.cpu_cores, int)
        assert node.nvme_gib > 0 and node.nvme_bandwidth_gbs > 0 and node.inter_node_bandwidth_gbs > 0
        if previous is not None:
            assert node.cpu_memory_gib >= previous.cpu_memory_gib
            assert node.nvme_gib >= previous.nvme_gib
        previous = node
    full = default_node(gpu, gpu.default_gpus_per_node)
    # enough host RAM per GPU to stage a GPU's worth of states, at least
    assert full.cpu_memory_gib / full.gpus_per_node >= 0.8 * gpu.memory_gib


def test_node_classes() -> None:
    a100 = default_node(GPUS["A100-80GB"], 8)
    assert a100.cpu_memory_gib == 1024 and a100.inter_node_bandwidth_gbs == 200
    h100 = default_node(GPUS["H100-80GB"], 8)
    assert h100.cpu_memory_gib == 2048 and h100.nvme_gib > 10_000
    ws = default_node(GPUS["RTX4090"], 1)
    assert ws.cpu_memory_gib == 128 and 1800 < ws.nvme_gib < 2000 and ws.inter_node_bandwidth_gbs <= 12.5
    custom = dataclasses.replace(GPUS["RTX4090"], name="RTX5090")
    assert default_node(custom, 2).cpu_memory_gib == 128
    assert default_node(GPUS["GH200"], 1).cpu_memory_gib == 450  # the Grace CPU's LPDDR5X (480 GB), not a server slice
    assert default_node(GPUS["MI250X"], 8).cpu_memory_gib == 512  # 8 GCDs, as Frontier / LUMI-G nodes
    assert default_node(GPUS["RTX6000-Ada"], 1).cpu_memory_gib == 128  # a pro card: workstation


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000-Ada"),
        ("NVIDIA RTX A5000", "RTX-A5000"),
        ("a5000", "RTX-A5000"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA L40", "L40"),
        ("AMD Instinct MI250X / MI250", "MI250X"),
        ("mi325x", "MI325X"),
    ],
)
def test_new_spellings(spelling: str, canonical: str) -> None:
    gpu, note = resolve_gpu(spelling)
    assert (gpu.name, note) == (canonical, None)


def test_mi250x_is_one_gcd() -> None:
    gpu, note = resolve_gpu("MI250")
    assert gpu.name == "MI250X" and note is not None and "GCD" in note
    assert gpu.memory_gib < 64 and gpu.peak_bf16_tflops == pytest.approx(383 / 2)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_default_node_rejects_bad_counts(n: object) -> None:
    with pytest.raises(InvalidSpecError):
        default_node(GPUS["A100-80GB"], n)  # type: ignore[arg-type]
