"""Tests for launcher.hardware: cluster-shape parsing, overrides, errors (the GPU catalog and node
defaults: tests/test_gpu_catalog.py)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from launcher.errors import FtlaunchError, InvalidSpecError, UnknownGpuError
from launcher.gpus import GPUS, resolve_gpu
from launcher.hardware import ClusterSpec, default_node, parse_gpus

# --- parse forms ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gpu", "nodes", "per_node"),
    [
        ("8xA100", "A100-80GB", 1, 8),
        ("A100-40GB", "A100-40GB", 1, 1),
        ("2x8xH100-80GB", "H100-80GB", 2, 8),
        ("1xRTX4090", "RTX4090", 1, 1),
        ("4xL40S", "L40S", 1, 4),
        ("H200", "H200", 1, 1),
        ("16xA100", "A100-80GB", 2, 8),
        ("16x8xH100-96GB", "H100-96GB", 16, 8),
        ("8×A100-80GB", "A100-80GB", 1, 8),
        ("8 x A100", "A100-80GB", 1, 8),
        ("2 X 8 X h100", "H100-80GB", 2, 8),
        ("8xmi300x", "MI300X", 1, 8),
        ("2x8xRTX 3090", "RTX3090", 2, 8),
        ("  4xT4  ", "T4", 1, 4),
        ("24xA100-40GB", "A100-40GB", 3, 8),
        ("8xRTX4090", "RTX4090", 2, 4),
        ("1x8xRTX4090", "RTX4090", 1, 8),
        ("3xB200", "B200", 1, 3),
    ],
)
def test_parse_forms(text: str, gpu: str, nodes: int, per_node: int) -> None:
    c = parse_gpus(text)
    assert (c.gpu.name, c.nodes, c.gpus_per_node) == (gpu, nodes, per_node)
    assert c.node.gpus_per_node == per_node
    assert c.world_size == nodes * per_node


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("a100-80g", "A100-80GB"),
        ("A100_80GB", "A100-80GB"),
        ("a100 80gb", "A100-80GB"),
        ("A100 80GiB", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("a100-40g", "A100-40GB"),
        ("h100", "H100-80GB"),
        ("H100 SXM", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("h100-pcie", "H100-PCIe"),
        ("H100 PCIe", "H100-PCIe"),
        ("h100_96gb", "H100-96GB"),
        ("NVIDIA H200", "H200"),
        ("RTX 3090", "RTX3090"),
        ("rtx3090", "RTX3090"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("4090", "RTX4090"),
        ("mi300x", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("v100-32gb", "V100-32GB"),
        ("a10", "A10"),
        ("A10G", "A10G"),
        ("l4", "L4"),
        ("Tesla T4", "T4"),
        ("l40s", "L40S"),
        ("a6000", "RTX-A6000"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("b200", "B200"),
    ],
)
def test_spellings(spelling: str, canonical: str) -> None:
    assert resolve_gpu(spelling)[0].name == canonical
    assert parse_gpus(spelling).gpu.name == canonical
    assert parse_gpus(f"2x{spelling}").gpu.name == canonical


def test_a10_and_a100_do_not_collide() -> None:
    assert parse_gpus("4xA10").gpu.name == "A10"
    assert parse_gpus("4xA100").gpu.name == "A100-80GB"
    assert parse_gpus("4xA10G").gpu.name == "A10G"


def test_every_canonical_name_resolves_to_itself_without_a_note() -> None:
    for name, gpu in GPUS.items():
        assert resolve_gpu(name) == (gpu, None)
        assert resolve_gpu(name.lower()) == (gpu, None)


# --- ambiguity notes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "canonical", "mentions"),
    [
        ("A100", "A100-80GB", "A100-40GB"),
        ("H100", "H100-80GB", "H100-PCIe"),
        ("V100", "V100-32GB", "V100-16GB"),
        ("A6000", "RTX-A6000", "48 GB"),
        ("MI300", "MI300X", "MI300X"),
    ],
)
def test_ambiguous_names_resolve_to_a_documented_default(name: str, canonical: str, mentions: str) -> None:
    gpu, note = resolve_gpu(name)
    assert gpu.name == canonical
    assert note is not None and canonical in note and mentions in note
    c = parse_gpus(f"8x{name}")
    assert c.gpu.name == canonical
    assert note in c.notes


def test_unambiguous_names_have_no_note() -> None:
    for text in ("8xA100-80GB", "H200", "2x8xH100-80GB", "1xRTX4090", "4xL40S"):
        assert [n for n in parse_gpus(text).notes if not n.startswith("host RAM taken as")] == []


def test_one_or_two_pro_cards_are_a_workstation_and_the_output_says_what_it_assumed() -> None:
    one = parse_gpus("1xRTX-A6000")
    assert one.node.cpu_memory_gib == 128 and any("a workstation's" in n and "--cpu-memory" in n for n in one.notes)
    assert parse_gpus("8xRTX-A6000").node.cpu_memory_gib == 768  # a PCIe server's
    assert parse_gpus("1xA10G").node.cpu_memory_gib == 96  # a cloud slice, as before
    assert not any("host RAM taken" in n for n in parse_gpus("1xRTX-A6000", cpu_memory_gib=256).notes)


def test_split_into_default_nodes_adds_a_note() -> None:
    c = parse_gpus("16xA100-80GB")
    assert (c.nodes, c.gpus_per_node) == (2, 8)
    assert len(c.notes) == 1 and "2 nodes x 8" in c.notes[0] and "1x16xA100-80GB" in c.notes[0]
    c = parse_gpus("8xRTX4090")
    assert (c.nodes, c.gpus_per_node) == (2, 4)
    assert "1x8xRTX4090" in c.notes[0]


def test_large_split_note_does_not_suggest_an_impossible_node() -> None:
    c = parse_gpus("64xH100-80GB")
    assert (c.nodes, c.gpus_per_node) == (8, 8)
    assert "1x64" not in c.notes[0]


# --- overrides -----------------------------------------------------------------------------------------


def test_gpu_memory_override_keeps_the_name_and_notes_it() -> None:
    c = parse_gpus("8xA100-80GB", gpu_memory_gib=70)
    assert c.gpu.name == "A100-80GB"
    assert c.gpu_memory_gib == c.gpu.memory_gib == 70.0
    assert any("--gpu-memory" in n and "79.15" in n for n in c.notes)
    assert GPUS["A100-80GB"].memory_gib == 79.15  # the catalog is untouched


def test_node_overrides_replace_defaults() -> None:
    c = parse_gpus(
        "2x8xH100-80GB", cpu_memory_gib=512, nvme_gib=1000, inter_node_bandwidth_gbs=400, gpus_per_node=8
    )
    assert c.node.cpu_memory_gib == 512
    assert c.node.nvme_gib == 1000
    assert c.node.inter_node_bandwidth_gbs == 400
    default = default_node(GPUS["H100-80GB"], 8)
    assert c.node.cpu_cores == default.cpu_cores
    assert c.node.nvme_bandwidth_gbs == default.nvme_bandwidth_gbs


def test_nvme_zero_means_no_nvme() -> None:
    assert parse_gpus("8xA100", nvme_gib=0).node.nvme_gib == 0


@pytest.mark.parametrize(
    ("text", "gpn", "nodes", "per_node"),
    [
        ("8xA100", 4, 2, 4),
        ("16xA100", 16, 1, 16),
        ("16xA100", 4, 4, 4),
        ("2xA100", 8, 1, 2),
        ("8xRTX4090", 8, 1, 8),
        ("2x8xA100", 8, 2, 8),
    ],
)
def test_gpus_per_node_override(text: str, gpn: int, nodes: int, per_node: int) -> None:
    c = parse_gpus(text, gpus_per_node=gpn)
    assert (c.nodes, c.gpus_per_node) == (nodes, per_node)
    assert not any("split" in n for n in c.notes)


# --- errors --------------------------------------------------------------------------------------------


def _one_line(err: pytest.ExceptionInfo[FtlaunchError]) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.strip() == msg and 20 < len(msg) < 300
    assert isinstance(err.value, FtlaunchError) and err.value.exit_code == 2
    return msg


@pytest.mark.parametrize(
    ("text", "exc", "says"),
    [
        ("", InvalidSpecError, "8xA100"),
        ("   ", InvalidSpecError, "8xA100"),
        ("0xA100", InvalidSpecError, "at least 1"),
        ("-1xA100", InvalidSpecError, "at least 1"),
        ("axA100", InvalidSpecError, "'a' is not a whole number"),
        ("1.5xA100", InvalidSpecError, "not a whole number"),
        ("2x0xA100", InvalidSpecError, "at least 1"),
        ("0x8xA100", InvalidSpecError, "at least 1"),
        ("xA100", InvalidSpecError, "no number"),
        ("8x", InvalidSpecError, "no GPU"),
        ("A100x8", InvalidSpecError, "8xA100"),
        ("1x2x3xA100", InvalidSpecError, "too many"),
        ("200000xA100", InvalidSpecError, "100,000"),
        ("1000x1000xA100", InvalidSpecError, "100,000"),
        ("99999999999999999999xA100", InvalidSpecError, "not plausible"),
        ("9" * 150 + "xA100", InvalidSpecError, "not plausible"),
        ("9" * 5000 + "xA100", InvalidSpecError, "too long"),
        ("Q" * 150, UnknownGpuError, "QQQ..."),
        ("8x8x" + "Q" * 150, UnknownGpuError, "QQQ..."),
        ("2x32xA100", InvalidSpecError, "no node holds 32"),
        ("1x17xH100", InvalidSpecError, "at most 16"),
        ("12xA100", InvalidSpecError, "2x6xA100-80GB"),
        ("17xH100", InvalidSpecError, "17x1xH100-80GB"),
        ("10xRTX4090", InvalidSpecError, "5x2xRTX4090"),
        ("foo", UnknownGpuError, "ftlaunch gpus"),
        ("8xfoo", UnknownGpuError, "'foo'"),
        ("rtxfoo", UnknownGpuError, "'rtxfoo'"),
        ("H100-97GB", UnknownGpuError, "did you mean H100-96GB"),
        ("8xA1000", UnknownGpuError, "did you mean"),
        ("RTX 4080", UnknownGpuError, "RTX4090"),
    ],
)
def test_bad_shapes_fail_with_one_helpful_line(text: str, exc: type[FtlaunchError], says: str) -> None:
    with pytest.raises(exc) as err:
        parse_gpus(text)
    assert says in _one_line(err)


def test_unknown_gpu_points_at_the_gpu_list() -> None:
    with pytest.raises(UnknownGpuError) as err:
        resolve_gpu("Z9000")
    msg = _one_line(err)
    assert "Z9000" in msg and "`ftlaunch gpus`" in msg and "--gpu-memory" in msg


@pytest.mark.parametrize("flag", ["gpu_memory_gib", "cpu_memory_gib", "nvme_gib", "inter_node_bandwidth_gbs"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1, -0.5, True, "80"])
def test_bad_numeric_overrides(flag: str, value: object) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_gpus("8xA100", **{flag: value})
    assert "--" in _one_line(err)


@pytest.mark.parametrize("flag", ["gpu_memory_gib", "cpu_memory_gib", "inter_node_bandwidth_gbs"])
def test_zero_overrides_are_rejected(flag: str) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_gpus("8xA100", **{flag: 0})
    assert "positive" in _one_line(err)


def test_gpu_memory_in_the_wrong_unit_is_caught() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_gpus("8xA100", gpu_memory_gib=81920)
    assert "GiB" in _one_line(err)


@pytest.mark.parametrize("gpn", [0, -8, 17, 64, 8.0, True, "8"])
def test_bad_gpus_per_node(gpn: object) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_gpus("8xA100", gpus_per_node=gpn)  # type: ignore[arg-type]
    assert "--gpus-per-node" in _one_line(err)


def test_gpus_per_node_conflicting_with_the_shape() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_gpus("2x8xA100", gpus_per_node=4)
    assert "--gpus-per-node is 4" in _one_line(err)


def test_uneven_split_with_gpus_per_node() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_gpus("12xA100", gpus_per_node=8)
    assert "2x6x" in _one_line(err)


def test_resolve_gpu_empty_name() -> None:
    with pytest.raises(InvalidSpecError) as err:
        resolve_gpu("  ")
    assert "A100-80GB" in _one_line(err)


# --- arithmetic and description ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "world"),
    [("A100", 1), ("8xA100", 8), ("2x8xA100", 16), ("16xA100", 16), ("16x8xH100-96GB", 128), ("4x4xL4", 16)],
)
def test_world_size(text: str, world: int) -> None:
    c = parse_gpus(text)
    assert c.world_size == world == c.nodes * c.gpus_per_node


def test_max_total_is_allowed() -> None:
    c = parse_gpus("12500x8xH100-80GB")
    assert c.world_size == 100_000


def test_cluster_spec_validates_and_is_frozen() -> None:
    gpu = GPUS["A100-80GB"]
    with pytest.raises(InvalidSpecError):
        ClusterSpec(gpu=gpu, nodes=0, node=default_node(gpu, 8))
    c = ClusterSpec(gpu=gpu, nodes=2, node=default_node(gpu, 8))
    assert c.notes == () and c.world_size == 16 and c.gpu_memory_gib == 79.15
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.nodes = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.memory_gib = 1  # type: ignore[misc]


def test_describe() -> None:
    d = parse_gpus("2x8xA100-80GB").describe()
    assert d.startswith("2 nodes x 8 x A100-80GB (79.2 GiB each), 1024 GiB host RAM / node")
    assert "nvlink 300 GB/s" in d and "200 GB/s between nodes" in d
    d = parse_gpus("RTX4090").describe()
    assert d.startswith("1 node x 1 x RTX4090 (23.6 GiB each)") and "between nodes" not in d
    assert "\n" not in d


def test_planning_import_stays_light() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import launcher.hardware; "
        "dt = time.perf_counter() - t; "
        "heavy = [m for m in ('torch', 'transformers', 'deepspeed', 'pydantic', 'numpy') if m in sys.modules]; "
        "print(heavy, dt)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    heavy, seconds = out.rsplit(" ", 1)
    assert heavy == "[]"
    assert float(seconds) < 0.5
