"""Cluster shapes: default nodes per GPU type and parsing of "8xA100" or "2x8xH100-80GB".

The GPU types themselves are in launcher/gpus.py.

Stdlib only (the planning path must import fast). GB/s are decimal (1e9 bytes/s); memory is GiB.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from launcher.errors import InvalidSpecError, UnknownGpuError
from launcher.gpus import GpuType, clip, lookup, node_class, resolve_gpu

MAX_GPUS_PER_NODE = 16  # no shipping server holds more; more is a typo or an NxMxGPU shape written wrong
MAX_TOTAL_GPUS = 100_000


@dataclass(frozen=True)
class NodeSpec:
    gpus_per_node: int
    cpu_memory_gib: float
    nvme_gib: float
    nvme_bandwidth_gbs: float  # aggregate per node
    inter_node_bandwidth_gbs: float  # per node, one direction
    cpu_cores: int
    host_memory_bandwidth_gbs: float  # per node, the DRAM channels' theoretical rate


@dataclass(frozen=True)
class ClusterSpec:
    gpu: GpuType
    nodes: int
    node: NodeSpec
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.node.gpus_per_node < 1:
            raise InvalidSpecError(
                f"a cluster needs 1+ nodes of 1+ GPUs, got {self.nodes} x {self.gpus_per_node}"
            )

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.node.gpus_per_node

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu.memory_gib

    def describe(self) -> str:
        n, g = self.nodes, self.node
        parts = [
            f"{n} node{'s' if n != 1 else ''} x {g.gpus_per_node} x {self.gpu.name} "
            f"({self.gpu.memory_gib:.1f} GiB each)",
            f"{g.cpu_memory_gib:.0f} GiB host RAM / node",
            f"{g.nvme_gib:.0f} GiB NVMe / node",
        ]
        if g.gpus_per_node > 1:
            parts.append(f"{self.gpu.intra_node_link} {self.gpu.intra_node_bandwidth_gbs:g} GB/s / GPU")
        if n > 1:
            parts.append(f"{g.inter_node_bandwidth_gbs:g} GB/s between nodes")
        return ", ".join(parts)


# --- Node defaults -----------------------------------------------------------------------------------
# Per-GPU shares of a reference node (a smaller slice of it gets its share, as cloud VMs do), with floors.
# Fields: host RAM GiB, NVMe GiB, NVMe GB/s, inter-node GB/s (one direction), CPU cores, host memory
# GB/s (the CPUs' DRAM channels x their transfer rate: what CPU Adam streams its states through).
_NODE_CLASS = {
    # DGX-1 (V100): 512 GiB, 4 x 1.92 TB SATA SSD (~2 GB/s), 4 x 100 Gb/s EDR IB, 40 cores,
    # 2 x Xeon E5-2698 v4 with 4 x DDR4-2400 each (154 GB/s)
    "dgx-v100": (64, 894, 0.25, 6.25, 5, 19.2),
    # DGX A100: 1 TiB, 15 TB NVMe (~24 GB/s read), 8 x 200 Gb/s HDR IB = 200 GB/s, 128 cores,
    # 2 x EPYC 7742 with 8 x DDR4-3200 each (410 GB/s)
    "hgx-a100": (128, 1746, 3.0, 25, 16, 51.2),
    # DGX H100 / H200: 2 TiB, 8 x 3.84 TB NVMe (~40 GB/s), 112 cores, 2 x Xeon 8480C with 8 x
    # DDR5-4800 each (614 GB/s). Network taken as 8 x 200 Gb/s (200 GB/s), common in H100 clouds;
    # DGX H100 and p5-class nodes have 400: --inter-node-bandwidth 400
    "hgx-h100": (256, 3492, 5.0, 25, 14, 76.8),
    # DGX B200: 2 TiB (up to 4), 8 x 3.84 TB NVMe, 8 x 400 Gb/s = 400 GB/s, 112 cores, 2 x Xeon
    # 8570 with 8 x DDR5-5600 each (717 GB/s)
    "hgx-b200": (256, 3492, 5.0, 50, 14, 89.6),
    # 8 x MI300X OAM servers (e.g. Azure ND MI300X v5 class): ~2 TiB, ~28 TB NVMe, 8 x 400 Gb/s, 128
    # cores, 2 x EPYC 9654 with 12 x DDR5-4800 each (922 GB/s)
    "oam-mi300x": (256, 3492, 5.0, 50, 16, 115.2),
    # GH200 superchip: one GPU beside a 72-core Grace with 480 GB LPDDR5X (~450 GiB usable, 500
    # GB/s), its own NVMe (4 TB, ~7 GB/s), one 400 Gb/s NIC per superchip (NVIDIA GH200 datasheet)
    "gh200": (450, 3492, 7.0, 50, 72, 500.0),
    # 8-GPU PCIe cloud server (AWS g5/g6.48xlarge): 768 GiB, 7.6 TB NVMe (~8 GB/s), 100 Gb/s, 96
    # cores, 2 x EPYC 7R32 with 8 x DDR4-3200 each (410 GB/s)
    "pcie-server": (96, 885, 1.0, 1.5625, 12, 51.2),
    # Workstation: 128 GiB and one 2 TB PCIe4 NVMe (~7 GB/s) for 1-2 GPUs, 64 GiB per GPU beyond;
    # 25 Gb/s Ethernet (3.125 GB/s) between boxes; 16+ cores; 2 x DDR5-5600 (90 GB/s) or more
    "workstation": (64, 466, 1.75, 0, 6, 45.0),
}
_FLOORS = (128, 1863, 7.0, 3.125, 16, 89.6)  # used by the workstation class only


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _node_class(gpu: GpuType, gpus_per_node: int) -> str:
    cls = node_class(gpu.name)
    if cls == "pro-card":
        # a professional card (RTX A6000) sits in workstations by ones and twos, in PCIe servers by
        # eights: one is not a slice of such a server (its share, 96 GiB, sent a 48 GB workstation's
        # full fine-tune of an 8B to NVMe)
        return "workstation" if gpus_per_node <= 2 else "pcie-server"
    if cls:
        return cls
    if gpu.default_gpus_per_node >= 8:
        return "pcie-server" if gpu.intra_node_link == "pcie" else "hgx-a100"
    return "workstation"


def default_node(gpu: GpuType, gpus_per_node: int) -> NodeSpec:
    """The documented default node for `gpus_per_node` GPUs of this type (see _NODE_CLASS)."""
    if not _whole(gpus_per_node) or gpus_per_node < 1:
        raise InvalidSpecError(f"GPUs per node must be a whole number of at least 1, got {gpus_per_node!r}")
    cls = _node_class(gpu, gpus_per_node)
    per_gpu = _NODE_CLASS[cls]
    floors = _FLOORS if cls == "workstation" else (0, 0, 0, 3.125, 1, 0)
    ram, nvme, nvme_bw, net, cores, mem_bw = (
        max(f, v * gpus_per_node) for v, f in zip(per_gpu, floors, strict=True)
    )
    return NodeSpec(gpus_per_node, float(ram), float(nvme), float(nvme_bw), float(net), int(cores), float(mem_bw))


# --- Parsing -----------------------------------------------------------------------------------------
_SHAPE_HELP = "write GPUSxGPU (8xA100) or NODESxGPUS_PER_NODExGPU (2x8xH100-80GB)"
_PEEL = re.compile(r"^\s*([^xX]*?)\s*[xX]\s*(.*)$", re.DOTALL)
_NUMBERISH = re.compile(r"[-+]?[0-9]*\.?[0-9]*", re.ASCII)


def _peel(s: str) -> tuple[list[str], str] | None:
    """Split 'Ax Bx NAME' into count tokens and a GPU name that resolves; None if no split resolves."""
    counts: list[str] = []
    rest = s.strip()
    while lookup(rest) is None:
        m = _PEEL.match(rest)
        if m is None or len(counts) == 8:
            return None
        counts.append(m.group(1))
        rest = m.group(2).strip()
        if not rest:
            return None
    return counts, rest


def _count(tok: str, text: str) -> int:
    if not tok:
        raise InvalidSpecError(f"'{clip(text)}' has an 'x' with no number before it; {_SHAPE_HELP}")
    if re.fullmatch(r"[+-]?[0-9]+", tok, re.ASCII):
        if len(tok.lstrip("+-")) > 9:
            raise InvalidSpecError(f"'{clip(text)}': {tok[:12]}... GPUs is not plausible; check the counts")
        value = int(tok)
        if value < 1:
            raise InvalidSpecError(f"'{clip(text)}': counts must be at least 1, got {value}; {_SHAPE_HELP}")
        return value
    raise InvalidSpecError(f"'{clip(text)}': '{clip(tok)}' is not a whole number of GPUs; {_SHAPE_HELP}")


def _number(value: float | None, flag: str, *, allow_zero: bool = False) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "a positive number"
        raise InvalidSpecError(f"{flag} must be {least}, got {value!r}; e.g. {flag} 80")
    return float(value)


def _shape_error(text: str) -> Exception:
    """The most helpful error for a --gpus value in which no GPU name could be found."""
    rev = re.fullmatch(r"\s*(.*?)\s*[xX]\s*([0-9]+)\s*", text)
    if rev and lookup(rev.group(1)):
        return InvalidSpecError(f"'{clip(text)}': put the count first, e.g. {rev[2][:9]}x{clip(rev[1])}")
    rest = text.strip()
    while (m := _PEEL.match(rest)) and _NUMBERISH.fullmatch(m.group(1)):
        if not m.group(2).strip():
            return InvalidSpecError(f"'{clip(text)}' names no GPU after the count; {_SHAPE_HELP}")
        rest = m.group(2).strip()
    try:
        resolve_gpu(rest)
    except UnknownGpuError as err:
        return err
    return InvalidSpecError(f"cannot read '{clip(text)}' as a cluster shape; {_SHAPE_HELP}")


def parse_gpus(
    text: str,
    *,
    gpu_memory_gib: float | None = None,
    cpu_memory_gib: float | None = None,
    nvme_gib: float | None = None,
    gpus_per_node: int | None = None,
    inter_node_bandwidth_gbs: float | None = None,
    cpu_cores: int | None = None,
) -> ClusterSpec:
    """Parse '8xA100', 'A100-40GB', '2x8xH100-80GB', '16xA100' (split into nodes) and apply overrides.

    nvme_gib may be 0 (no NVMe to offload to); the other overrides must be positive and finite.
    """
    if not isinstance(text, str) or not text.strip() or len(text) > 200:
        what = "is empty" if not isinstance(text, str) or not text.strip() else f"'{clip(text)}' is too long"
        raise InvalidSpecError(f"--gpus {what}; {_SHAPE_HELP} (`ftlaunch gpus` lists the GPUs)")
    text = text.strip().replace("×", "x").replace("*", "x")
    gpu_mem = _number(gpu_memory_gib, "--gpu-memory")
    cpu_mem = _number(cpu_memory_gib, "--cpu-memory")
    nvme = _number(nvme_gib, "--nvme", allow_zero=True)
    net = _number(inter_node_bandwidth_gbs, "--inter-node-bandwidth")
    if gpus_per_node is not None and not (_whole(gpus_per_node) and 1 <= gpus_per_node <= MAX_GPUS_PER_NODE):
        raise InvalidSpecError(
            f"--gpus-per-node must be a whole number from 1 to {MAX_GPUS_PER_NODE}, got {gpus_per_node!r}"
        )
    if cpu_cores is not None and not (_whole(cpu_cores) and 1 <= cpu_cores <= 4096):
        raise InvalidSpecError(f"--cpu-cores must be a whole number from 1 to 4096 per node, got {cpu_cores!r}")
    if gpu_mem is not None and gpu_mem > 1024:
        raise InvalidSpecError(f"--gpu-memory {gpu_mem:g} is more than any GPU has; it takes GiB, e.g. 80")

    peeled = _peel(text)
    if peeled is None:
        raise _shape_error(text)
    tokens, name = peeled
    if len(tokens) > 2:
        raise InvalidSpecError(f"'{clip(text)}' has too many counts; {_SHAPE_HELP}")
    counts = [_count(t, text) for t in tokens]
    gpu, note = resolve_gpu(name)
    notes = [note] if note else []
    total = math.prod(counts)
    if total > MAX_TOTAL_GPUS:
        raise InvalidSpecError(f"'{clip(text)}' is {total:,} GPUs, over {MAX_TOTAL_GPUS:,}; check the counts")

    if len(counts) == 2:
        nodes, per_node = counts
        if per_node > MAX_GPUS_PER_NODE:
            raise InvalidSpecError(
                f"'{clip(text)}': no node holds {per_node} GPUs (at most {MAX_GPUS_PER_NODE}); {_SHAPE_HELP}"
            )
        if gpus_per_node is not None and gpus_per_node != per_node:
            raise InvalidSpecError(
                f"'{clip(text)}' says {per_node} GPUs per node but --gpus-per-node is {gpus_per_node}; drop one"
            )
    else:
        holds = gpus_per_node or gpu.default_gpus_per_node
        if total <= holds:
            nodes, per_node = 1, total
        elif total % holds == 0:
            nodes, per_node = total // holds, holds
            if gpus_per_node is None:
                alt = f"write 1x{total}x{gpu.name} if one node holds all {total}, or " if total <= 16 else ""
                notes.append(
                    f"{total} x {gpu.name} split into {nodes} nodes x {holds} ({holds} per node is the "
                    f"default for {gpu.name}); {alt}pass --gpus-per-node to change it"
                )
        else:
            fit = max(d for d in range(1, holds + 1) if total % d == 0)
            raise InvalidSpecError(
                f"'{clip(text)}': {total} GPUs do not split into nodes of {holds}; write "
                f"NODESxGPUS_PER_NODExGPU, e.g. {total // fit}x{fit}x{gpu.name}, or pass --gpus-per-node"
            )

    node = default_node(gpu, per_node)
    if cpu_mem is None and _node_class(gpu, per_node) == "workstation":
        notes.append(
            f"host RAM taken as {node.cpu_memory_gib:g} GiB per node, a workstation's ({per_node} x {gpu.name}); "
            "--cpu-memory sets what yours has"
        )
    given = {"cpu_memory_gib": cpu_mem, "nvme_gib": nvme, "inter_node_bandwidth_gbs": net}
    node = replace(node, **{k: v for k, v in given.items() if v is not None})
    if cpu_cores is not None:  # the same CPUs, more or fewer of them: memory channels scale along
        share = node.host_memory_bandwidth_gbs / node.cpu_cores
        node = replace(node, cpu_cores=cpu_cores, host_memory_bandwidth_gbs=share * cpu_cores)
    if gpu_mem is not None:
        notes.append(f"GPU memory set to {gpu_mem:g} GiB by --gpu-memory ({gpu.name} has {gpu.memory_gib:g})")
        gpu = replace(gpu, memory_gib=gpu_mem)
    return ClusterSpec(gpu=gpu, nodes=nodes, node=node, notes=tuple(notes))
