"""GPU catalog, default node shapes, and parsing of cluster shapes such as "8xA100" or "2x8xH100-80GB".

Stdlib only (the planning path must import fast). Every figure is per GPU unless it says per node.
GB/s are decimal (1e9 bytes/s); memory is GiB (2**30 bytes), as torch reports it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from launcher.errors import InvalidSpecError, UnknownGpuError

MAX_GPUS_PER_NODE = 16  # no shipping server holds more; more is a typo or an NxMxGPU shape written wrong
MAX_TOTAL_GPUS = 100_000


@dataclass(frozen=True)
class GpuType:
    name: str  # canonical, e.g. "A100-80GB"
    vendor: str  # "nvidia" | "amd"
    memory_gib: float  # usable by the framework: torch.cuda.get_device_properties().total_memory
    bf16: bool
    fp8: bool
    peak_bf16_tflops: float  # dense; fp16 tensor-core figure where bf16 is False
    hbm_bandwidth_gbs: float
    intra_node_link: str  # "nvlink" | "pcie" | "infinity-fabric"
    intra_node_bandwidth_gbs: float  # per GPU, one direction, for collectives
    pcie_bandwidth_gbs: float  # host <-> GPU, one direction
    price_per_hour_usd: float  # default cloud price per GPU-hour; users override
    default_gpus_per_node: int


@dataclass(frozen=True)
class NodeSpec:
    gpus_per_node: int
    cpu_memory_gib: float
    nvme_gib: float
    nvme_bandwidth_gbs: float  # aggregate per node
    inter_node_bandwidth_gbs: float  # per node, one direction
    cpu_cores: int


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


# --- The catalog -------------------------------------------------------------------------------------
# memory_gib: torch's total_memory (nvidia-smi shows a little more). "seen <where>" = printed by torch
#   ("total capacity of N GiB") in that public OOM report; "reported" = the figure such reports commonly
#   show, not re-checked here; "est." = nvidia-smi total less the ~0.5-0.9 GiB kept on similar cards.
# peak_bf16_tflops: vendor datasheet, dense (the datasheets' headline figures are with 2:4 sparsity).
#   GeForce cards: bf16 with fp32 accumulate (the fp16-accumulate figure is twice that, unused in training).
# intra_node_bandwidth_gbs: NVLink3 600 GB/s total = 300 per direction, NVLink4 450, NVLink5 900,
#   Infinity Fabric 7 x 64 GB/s = 448; PCIe usable x16: gen3 ~12, gen4 ~25, gen5 ~50 GB/s. GeForce
#   cards have no PCIe peer-to-peer: NCCL stages through host memory, taken as 20.
# price_per_hour_usd: rough late-2025 on-demand street price per GPU-hour (Lambda / RunPod / the big
#   clouds' per-GPU list prices, rounded). It only ranks plans by cost; users override it.
# default_gpus_per_node: 8 for SXM/OAM boards and for the 8-GPU PCIe servers clouds rent (g5/g6/L40S);
#   4 for GeForce cards (a 4-GPU workstation or rental box; write 1x8xRTX4090 for an 8-GPU box).
_CATALOG = (
    # reported 39.59 (A100-SXM4-40GB); 1555 GB/s HBM2
    GpuType("A100-40GB", "nvidia", 39.59, True, False, 312, 1555, "nvlink", 300, 25, 1.29, 8),
    # reported 79.15 (A100-SXM4-80GB); 2039 GB/s HBM2e
    GpuType("A100-80GB", "nvidia", 79.15, True, False, 312, 2039, "nvlink", 300, 25, 1.79, 8),
    # seen vllm-project/vllm#27508 79.11 (H100 80GB HBM3, SXM5); 3350 GB/s
    GpuType("H100-80GB", "nvidia", 79.11, True, True, 989, 3350, "nvlink", 450, 50, 2.99, 8),
    # est. 79.1 (same 81559 MiB as SXM); 756 TFLOPS, 2000 GB/s HBM2e; NVLink bridges (pairs) ignored
    GpuType("H100-PCIe", "nvidia", 79.1, True, True, 756, 2000, "pcie", 50, 50, 2.49, 8),
    # Meta's H100 with 96 GB HBM2e at 2.4 TB/s (torchtitan's docs/performance.md benchmarks): treated as
    # H100 SXM (989 TFLOPS peak; torchtitan notes its 500 W cap puts the real peak below that).
    # est. 94.5: 96 GiB of HBM less ~1.5 GiB (summaries of the torchtitan paper say ~95 GiB): conservative.
    GpuType("H100-96GB", "nvidia", 94.5, True, True, 989, 2400, "nvlink", 450, 50, 2.99, 8),
    # est. 139.8 (nvidia-smi 143771 MiB); 141 GB HBM3e, 4800 GB/s
    GpuType("H200", "nvidia", 139.8, True, True, 989, 4800, "nvlink", 450, 50, 3.79, 8),
    # est. 178.4 (nvidia-smi 183359 MiB); 2250 TFLOPS dense bf16 (HGX B200), 8000 GB/s HBM3e, NVLink5
    GpuType("B200", "nvidia", 178.4, True, True, 2250, 8000, "nvlink", 900, 50, 5.99, 8),
    # reported 15.77 (V100-SXM2-16GB); no bf16: 125 TFLOPS fp16 tensor; NVLink2 300 GB/s total = 150
    GpuType("V100-16GB", "nvidia", 15.77, False, False, 125, 900, "nvlink", 150, 12, 0.55, 8),
    # reported 31.75 (V100-SXM2-32GB)
    GpuType("V100-32GB", "nvidia", 31.75, False, False, 125, 900, "nvlink", 150, 12, 0.80, 8),
    # seen zai-org/CogVLM#236 21.99 (Lambda A10, 24 GB GDDR6); 125 TFLOPS, 600 GB/s
    GpuType("A10", "nvidia", 21.99, True, False, 125, 600, "pcie", 25, 25, 0.75, 8),
    # AWS-only A10G: same 24 GB board (nvidia-smi 23028 MiB, as A10); NVIDIA publishes no datasheet,
    # the A10's 125 TFLOPS is what tables quote (some reports put it lower).
    GpuType("A10G", "nvidia", 21.99, True, False, 125, 600, "pcie", 25, 25, 1.01, 8),
    # est. 22.05 (nvidia-smi 23034 MiB); 121 TFLOPS, 300 GB/s GDDR6
    GpuType("L4", "nvidia", 22.05, True, True, 121, 300, "pcie", 25, 25, 0.80, 8),
    # seen hpcaitech/Open-Sora#697 14.75 (Colab T4); no bf16: 65 TFLOPS fp16 tensor; PCIe gen3
    GpuType("T4", "nvidia", 14.75, False, False, 65, 320, "pcie", 12, 12, 0.35, 8),
    # seen QwenLM/Qwen3-VL#2097 44.40 (on an L40, same 46068 MiB board); 362 TFLOPS, 864 GB/s GDDR6
    GpuType("L40S", "nvidia", 44.4, True, True, 362, 864, "pcie", 25, 25, 1.20, 8),
    # reported 23.69 (GeForce RTX 3090); 71 TFLOPS (fp32 accumulate), 936 GB/s
    GpuType("RTX3090", "nvidia", 23.69, True, False, 71, 936, "pcie", 20, 25, 0.25, 4),
    # seen zai-org/CogVideo#36 23.68; newer drivers keep more, 23.65 taken; 165 TFLOPS, 1008 GB/s
    GpuType("RTX4090", "nvidia", 23.65, True, True, 165, 1008, "pcie", 20, 25, 0.40, 4),
    # reported 47.54 (nvidia-smi 49140 MiB); RTX A6000 (Ampere, 48 GB), 155 TFLOPS, 768 GB/s
    GpuType("RTX-A6000", "nvidia", 47.54, True, False, 155, 768, "pcie", 25, 25, 0.60, 8),
    # reported 191.98 (ROCm torch); 1307 TFLOPS dense bf16, 5300 GB/s HBM3
    GpuType("MI300X", "amd", 191.98, True, True, 1307, 5300, "infinity-fabric", 448, 50, 2.50, 8),
)
GPUS: dict[str, GpuType] = {g.name: g for g in _CATALOG}

# Short names that mean more than one card resolve to one documented default; the note says which.
_AMBIGUOUS = {
    "a100": ("A100-80GB", "A100 taken as A100-80GB (the default); write A100-40GB for the 40 GB card"),
    "h100": ("H100-80GB", "H100 taken as H100-80GB (SXM, the default); or write H100-PCIe or H100-96GB"),
    "v100": ("V100-32GB", "V100 taken as V100-32GB (the default); write V100-16GB for the 16 GB card"),
    "a6000": ("RTX-A6000", "A6000 taken as RTX-A6000 (Ampere, 48 GB), not the RTX 6000 Ada"),
    "mi300": ("MI300X", "MI300 taken as MI300X (192 GB), not the MI300A"),
}
# Canonical name -> (node class, see _NODE_CLASS; other spellings, as _key normalises them).
_EXTRA = {
    "A100-40GB": ("hgx-a100", ""),
    "A100-80GB": ("hgx-a100", ""),
    "H100-80GB": ("hgx-h100", ""),
    "H100-PCIe": ("pcie-server", "h10080gpcie h100pcie80g"),
    "H100-96GB": ("hgx-h100", ""),
    "H200": ("hgx-h100", "h200141g"),
    "B200": ("hgx-b200", "b200180g b200192g"),
    "V100-16GB": ("dgx-v100", ""),
    "V100-32GB": ("dgx-v100", ""),
    "A10": ("pcie-server", "a1024g"),
    "A10G": ("pcie-server", "a10g24g"),
    "L4": ("pcie-server", "l424g"),
    "T4": ("pcie-server", "t416g"),
    "L40S": ("pcie-server", "l40s48g"),
    "RTX3090": ("workstation", "3090 rtx309024g"),
    "RTX4090": ("workstation", "4090 rtx409024g"),
    "RTX-A6000": ("pcie-server", "rtxa600048g a600048g"),
    "MI300X": ("oam-mi300x", "mi300x192g"),
}
_NOISE = ("nvidia", "geforce", "tesla", "quadro", "instinct", "amd")


def _key(name: str) -> str:
    """Normalise a GPU spelling: 'NVIDIA A100-SXM4-80GB' -> 'a10080g', 'RTX 3090' -> 'rtx3090'."""
    k = re.sub(r"[\s_\-./()]+", "", name.lower())
    for word in _NOISE:
        k = k.replace(word, "")
    k = re.sub(r"sxm\d?|hbm\d?e?", "", k)
    return re.sub(r"(\d)gi?b", r"\1g", k)


_LOOKUP: dict[str, tuple[str, str | None]] = {_key(n): (n, None) for n in GPUS}
_LOOKUP.update({k: (n, None) for n, (_, keys) in _EXTRA.items() for k in keys.split()})
_LOOKUP.update(_AMBIGUOUS)


def list_gpus() -> list[GpuType]:
    """All catalog entries, datacenter NVIDIA first, then PCIe / consumer cards, then AMD."""
    return list(_CATALOG)


def _clip(text: str, width: int = 40) -> str:
    """User text echoed in an error, kept short enough for one line."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _lookup(name: str) -> tuple[GpuType, str | None] | None:
    hit = _LOOKUP.get(_key(name))
    return None if hit is None else (GPUS[hit[0]], hit[1])


def resolve_gpu(name: str) -> tuple[GpuType, str | None]:
    """Canonical GPU for any accepted spelling, and a note when an ambiguous name took a default."""
    if not name or not name.strip():
        raise InvalidSpecError("no GPU name given; write one such as A100-80GB (`ftlaunch gpus` lists them)")
    hit = _lookup(name)
    if hit is None:
        import difflib  # only on the error path

        close = difflib.get_close_matches(_key(name), list(_LOOKUP), n=6, cutoff=0.6)
        names = list(dict.fromkeys(_LOOKUP[c][0] for c in close))[:3]
        hint = f"did you mean {' or '.join(names)}? " if names else ""
        raise UnknownGpuError(
            f"unknown GPU '{_clip(name)}': {hint}`ftlaunch gpus` lists the known GPUs; "
            "or name the nearest one and set --gpu-memory to your card's memory"
        )
    return hit


# --- Node defaults -----------------------------------------------------------------------------------
# Per-GPU shares of a reference node (a smaller slice of it gets its share, as cloud VMs do), with floors.
# Fields: host RAM GiB, NVMe GiB, NVMe GB/s, inter-node GB/s (one direction), CPU cores.
_NODE_CLASS = {
    # DGX-1 (V100): 512 GiB, 4 x 1.92 TB SATA SSD (~2 GB/s), 4 x 100 Gb/s EDR IB, 40 cores
    "dgx-v100": (64, 894, 0.25, 6.25, 5),
    # DGX A100: 1 TiB, 15 TB NVMe (~24 GB/s read), 8 x 200 Gb/s HDR IB = 200 GB/s, 128 cores
    "hgx-a100": (128, 1746, 3.0, 25, 16),
    # DGX H100 / H200: 2 TiB, 8 x 3.84 TB NVMe (~40 GB/s), 112 cores. Network taken as 8 x 200 Gb/s
    # (200 GB/s), common in H100 clouds; DGX H100 and p5-class nodes have 400: --inter-node-bandwidth 400
    "hgx-h100": (256, 3492, 5.0, 25, 14),
    # DGX B200: 2 TiB (up to 4), 8 x 3.84 TB NVMe, 8 x 400 Gb/s = 400 GB/s, 112 cores
    "hgx-b200": (256, 3492, 5.0, 50, 14),
    # 8 x MI300X OAM servers (e.g. Azure ND MI300X v5 class): ~2 TiB, ~28 TB NVMe, 8 x 400 Gb/s, 128 cores
    "oam-mi300x": (256, 3492, 5.0, 50, 16),
    # 8-GPU PCIe cloud server (AWS g5/g6.48xlarge): 768 GiB, 7.6 TB NVMe (~8 GB/s), 100 Gb/s, 96 cores
    "pcie-server": (96, 885, 1.0, 1.5625, 12),
    # Workstation: 128 GiB and one 2 TB PCIe4 NVMe (~7 GB/s) for 1-2 GPUs, 64 GiB per GPU beyond;
    # 25 Gb/s Ethernet (3.125 GB/s) between boxes; 16+ cores
    "workstation": (64, 466, 1.75, 0, 6),
}
_FLOORS = (128, 1863, 7.0, 3.125, 16)  # used by the workstation class only


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _node_class(gpu: GpuType) -> str:
    if gpu.name in _EXTRA:
        return _EXTRA[gpu.name][0]
    if gpu.default_gpus_per_node >= 8:
        return "pcie-server" if gpu.intra_node_link == "pcie" else "hgx-a100"
    return "workstation"


def default_node(gpu: GpuType, gpus_per_node: int) -> NodeSpec:
    """The documented default node for `gpus_per_node` GPUs of this type (see _NODE_CLASS)."""
    if not _whole(gpus_per_node) or gpus_per_node < 1:
        raise InvalidSpecError(f"GPUs per node must be a whole number of at least 1, got {gpus_per_node!r}")
    cls = _node_class(gpu)
    per_gpu = _NODE_CLASS[cls]
    floors = _FLOORS if cls == "workstation" else (0, 0, 0, 3.125, 1)
    ram, nvme, nvme_bw, net, cores = (max(f, v * gpus_per_node) for v, f in zip(per_gpu, floors, strict=True))
    return NodeSpec(gpus_per_node, float(ram), float(nvme), float(nvme_bw), float(net), int(cores))


# --- Parsing -----------------------------------------------------------------------------------------
_SHAPE_HELP = "write GPUSxGPU (8xA100) or NODESxGPUS_PER_NODExGPU (2x8xH100-80GB)"
_PEEL = re.compile(r"^\s*([^xX]*?)\s*[xX]\s*(.*)$", re.DOTALL)
_NUMBERISH = re.compile(r"[-+]?[0-9]*\.?[0-9]*", re.ASCII)


def _peel(s: str) -> tuple[list[str], str] | None:
    """Split 'Ax Bx NAME' into count tokens and a GPU name that resolves; None if no split resolves."""
    counts: list[str] = []
    rest = s.strip()
    while _lookup(rest) is None:
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
        raise InvalidSpecError(f"'{_clip(text)}' has an 'x' with no number before it; {_SHAPE_HELP}")
    if re.fullmatch(r"[+-]?[0-9]+", tok, re.ASCII):
        if len(tok.lstrip("+-")) > 9:
            raise InvalidSpecError(f"'{_clip(text)}': {tok[:12]}... GPUs is not plausible; check the counts")
        value = int(tok)
        if value < 1:
            raise InvalidSpecError(f"'{_clip(text)}': counts must be at least 1, got {value}; {_SHAPE_HELP}")
        return value
    raise InvalidSpecError(f"'{_clip(text)}': '{_clip(tok)}' is not a whole number of GPUs; {_SHAPE_HELP}")


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
    if rev and _lookup(rev.group(1)):
        return InvalidSpecError(f"'{_clip(text)}': put the count first, e.g. {rev[2][:9]}x{_clip(rev[1])}")
    rest = text.strip()
    while (m := _PEEL.match(rest)) and _NUMBERISH.fullmatch(m.group(1)):
        if not m.group(2).strip():
            return InvalidSpecError(f"'{_clip(text)}' names no GPU after the count; {_SHAPE_HELP}")
        rest = m.group(2).strip()
    try:
        resolve_gpu(rest)
    except UnknownGpuError as err:
        return err
    return InvalidSpecError(f"cannot read '{_clip(text)}' as a cluster shape; {_SHAPE_HELP}")


def parse_gpus(
    text: str,
    *,
    gpu_memory_gib: float | None = None,
    cpu_memory_gib: float | None = None,
    nvme_gib: float | None = None,
    gpus_per_node: int | None = None,
    inter_node_bandwidth_gbs: float | None = None,
) -> ClusterSpec:
    """Parse '8xA100', 'A100-40GB', '2x8xH100-80GB', '16xA100' (split into nodes) and apply overrides.

    nvme_gib may be 0 (no NVMe to offload to); the other overrides must be positive and finite.
    """
    if not isinstance(text, str) or not text.strip() or len(text) > 200:
        what = "is empty" if not isinstance(text, str) or not text.strip() else f"'{_clip(text)}' is too long"
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
    if gpu_mem is not None and gpu_mem > 1024:
        raise InvalidSpecError(f"--gpu-memory {gpu_mem:g} is more than any GPU has; it takes GiB, e.g. 80")

    peeled = _peel(text)
    if peeled is None:
        raise _shape_error(text)
    tokens, name = peeled
    if len(tokens) > 2:
        raise InvalidSpecError(f"'{_clip(text)}' has too many counts; {_SHAPE_HELP}")
    counts = [_count(t, text) for t in tokens]
    gpu, note = resolve_gpu(name)
    notes = [note] if note else []
    total = math.prod(counts)
    if total > MAX_TOTAL_GPUS:
        raise InvalidSpecError(
            f"'{_clip(text)}' is {total:,} GPUs, over {MAX_TOTAL_GPUS:,}; check the counts"
        )

    if len(counts) == 2:
        nodes, per_node = counts
        if per_node > MAX_GPUS_PER_NODE:
            raise InvalidSpecError(
                f"'{_clip(text)}': no node holds {per_node} GPUs (at most {MAX_GPUS_PER_NODE}); {_SHAPE_HELP}"
            )
        if gpus_per_node is not None and gpus_per_node != per_node:
            raise InvalidSpecError(
                f"'{_clip(text)}' says {per_node} GPUs per node but --gpus-per-node is {gpus_per_node}; drop one"
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
                f"'{_clip(text)}': {total} GPUs do not split into nodes of {holds}; write "
                f"NODESxGPUS_PER_NODExGPU, e.g. {total // fit}x{fit}x{gpu.name}, or pass --gpus-per-node"
            )

    node = default_node(gpu, per_node)
    given = {"cpu_memory_gib": cpu_mem, "nvme_gib": nvme, "inter_node_bandwidth_gbs": net}
    node = replace(node, **{k: v for k, v in given.items() if v is not None})
    if gpu_mem is not None:
        notes.append(f"GPU memory set to {gpu_mem:g} GiB by --gpu-memory ({gpu.name} has {gpu.memory_gib:g})")
        gpu = replace(gpu, memory_gib=gpu_mem)
    return ClusterSpec(gpu=gpu, nodes=nodes, node=node, notes=tuple(notes))
