"""The GPU catalog: every GPU type ftlaunch knows, its figures, and the names users write for it.

Stdlib only (the planning path must import fast). Figures are per GPU; GB/s are decimal
(1e9 bytes/s); memory is GiB (2**30 bytes), as torch reports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.errors import InvalidSpecError, UnknownGpuError


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
    # est. 93.0 (nvidia-smi 95830 MiB, less what the SXM keeps); 94 GB HBM3, 3900 GB/s, 835 TFLOPS dense
    # (1671 with sparsity); a PCIe gen5 card: NVLink bridges (pairs) ignored, as for H100-PCIe
    GpuType("H100-NVL", "nvidia", 93.0, True, True, 835, 3900, "pcie", 50, 50, 2.69, 8),
    # Meta's H100 with 96 GB HBM2e at 2.4 TB/s (torchtitan's docs/performance.md benchmarks): treated as
    # H100 SXM (989 TFLOPS peak; torchtitan notes its 500 W cap puts the real peak below that).
    # est. 94.5: 96 GiB of HBM less ~1.5 GiB (summaries of the torchtitan paper say ~95 GiB): conservative.
    GpuType("H100-96GB", "nvidia", 94.5, True, True, 989, 2400, "nvlink", 450, 50, 2.99, 8),
    # est. 139.8 (nvidia-smi 143771 MiB); 141 GB HBM3e, 4800 GB/s
    GpuType("H200", "nvidia", 139.8, True, True, 989, 4800, "nvlink", 450, 50, 3.79, 8),
    # est. 95.0 (nvidia-smi 97871 MiB on "GH200 480GB" and "GH200 120GB" alike); the 96 GB HBM3 Hopper at
    # 4000 GB/s, 989 TFLOPS (H100 SXM). Host memory is the Grace CPU's LPDDR5X (480 GB) over NVLink-C2C,
    # 450 GB/s per direction: that link is the pcie figure. One superchip per node (Lambda-style); boards
    # of four are NVLink4-connected (450). The 144 GB HBM3e version: set --gpu-memory.
    GpuType("GH200", "nvidia", 95.0, True, True, 989, 4000, "nvlink", 450, 450, 1.49, 1),
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
    # seen QwenLM/Qwen3-VL#2097 44.40 (the L40S entry's figure, seen on an L40); 181 TFLOPS, 864 GB/s GDDR6
    GpuType("L40", "nvidia", 44.4, True, True, 181, 864, "pcie", 25, 25, 0.99, 8),
    # est. 44.4 (nvidia-smi 46068 MiB, ECC on, as L40 / L40S); 150 TFLOPS, 696 GB/s GDDR6; NVLink bridges
    # (pairs) ignored
    GpuType("A40", "nvidia", 44.4, True, False, 150, 696, "pcie", 25, 25, 0.40, 8),
    # reported 23.69 (GeForce RTX 3090); 71 TFLOPS (fp32 accumulate), 936 GB/s
    GpuType("RTX3090", "nvidia", 23.69, True, False, 71, 936, "pcie", 20, 25, 0.25, 4),
    # seen zai-org/CogVideo#36 23.68; newer drivers keep more, 23.65 taken; 165 TFLOPS, 1008 GB/s
    GpuType("RTX4090", "nvidia", 23.65, True, True, 165, 1008, "pcie", 20, 25, 0.40, 4),
    # reported 47.54 (nvidia-smi 49140 MiB); RTX A6000 (Ampere, 48 GB), 155 TFLOPS, 768 GB/s
    GpuType("RTX-A6000", "nvidia", 47.54, True, False, 155, 768, "pcie", 25, 25, 0.60, 8),
    # est. 23.55 (nvidia-smi 24564 MiB less the ~0.45 GiB the RTX A6000 keeps); RTX A5000 (Ampere, 24 GB),
    # 111 TFLOPS, 768 GB/s GDDR6
    GpuType("RTX-A5000", "nvidia", 23.55, True, False, 111, 768, "pcie", 25, 25, 0.27, 8),
    # est. 47.5 (nvidia-smi 49140 MiB, as the RTX A6000); RTX 6000 Ada (48 GB), 364 TFLOPS (pro cards
    # accumulate in fp32 at full rate), 960 GB/s GDDR6, no NVLink
    GpuType("RTX6000-Ada", "nvidia", 47.5, True, True, 364, 960, "pcie", 25, 25, 0.77, 8),
    # ONE GCD, as torch sees it: an MI250X module is two GCDs, each its own 64 GB HBM2e device, so
    # 8xMI250X is 8 GCDs = 4 modules. est. 63.98 (64 GiB less what MI300X keeps); 383 TFLOPS dense bf16 and
    # 3277 GB/s per module, half per GCD. Infinity Fabric (HPE nodes such as Frontier / LUMI-G, 8 GCDs):
    # 200 GB/s per direction to the other GCD of the package, 50-100 to the rest, 100 taken; CPU <-> GCD
    # is Infinity Fabric too, 36 GB/s.
    GpuType("MI250X", "amd", 63.98, True, False, 191.5, 1638, "infinity-fabric", 100, 36, 0.85, 8),
    # reported 191.98 (ROCm torch); 1307 TFLOPS dense bf16, 5300 GB/s HBM3
    GpuType("MI300X", "amd", 191.98, True, True, 1307, 5300, "infinity-fabric", 448, 50, 2.50, 8),
    # est. 255.98 (as MI300X shows 191.98 of 192; MI355X 287.98 of 288 seen ROCm/TheRock#2118); 256 GB
    # HBM3E, 6000 GB/s, 1307 TFLOPS dense bf16 (MI300X's compute), 8-GPU OAM board as MI300X
    GpuType("MI325X", "amd", 255.98, True, True, 1307, 6000, "infinity-fabric", 448, 50, 2.75, 8),
)
GPUS: dict[str, GpuType] = {g.name: g for g in _CATALOG}

# Short names that mean more than one card resolve to one documented default; the note says which.
_AMBIGUOUS = {
    "a100": ("A100-80GB", "A100 taken as A100-80GB (the default); write A100-40GB for the 40 GB card"),
    "h100": ("H100-80GB", "H100 taken as H100-80GB (SXM, the default); or write H100-PCIe, H100-NVL or H100-96GB"),
    "v100": ("V100-32GB", "V100 taken as V100-32GB (the default); write V100-16GB for the 16 GB card"),
    "a6000": ("RTX-A6000", "A6000 taken as RTX-A6000 (Ampere, 48 GB), not the RTX 6000 Ada"),
    "mi300": ("MI300X", "MI300 taken as MI300X (192 GB), not the MI300A"),
    "mi250": ("MI250X", "MI250 taken as MI250X (one GCD, 64 GB); the MI250 has about 5% less compute"),
}
# Canonical name -> (node class, see launcher/hardware.py's _NODE_CLASS, or "pro-card": a workstation
# for 1-2 cards, a PCIe server beyond; other spellings, as _key normalises them).
_EXTRA = {
    "A100-40GB": ("hgx-a100", ""),
    "A100-80GB": ("hgx-a100", ""),
    "H100-80GB": ("hgx-h100", ""),
    "H100-PCIe": ("pcie-server", "h10080gpcie h100pcie80g"),
    "H100-NVL": ("pcie-server", "h100nvl94g h10094g"),
    "H100-96GB": ("hgx-h100", ""),
    "H200": ("hgx-h100", "h200141g"),
    "GH200": ("gh200", "gh20096g gh200480g gh200120g"),  # a superchip: the Grace CPU's memory is its host RAM
    "B200": ("hgx-b200", "b200180g b200192g"),
    "V100-16GB": ("dgx-v100", ""),
    "V100-32GB": ("dgx-v100", ""),
    "A10": ("pcie-server", "a1024g"),
    "A10G": ("pcie-server", "a10g24g"),
    "L4": ("pcie-server", "l424g"),
    "T4": ("pcie-server", "t416g"),
    "L40S": ("pcie-server", "l40s48g"),
    "L40": ("pcie-server", "l4048g"),
    "A40": ("pcie-server", "a4048g"),
    "RTX3090": ("workstation", "3090 rtx309024g"),
    "RTX4090": ("workstation", "4090 rtx409024g"),
    "RTX-A6000": ("pro-card", "rtxa600048g a600048g"),  # workstation (1-2 cards) or PCIe server
    "RTX-A5000": ("pro-card", "a5000 rtxa500024g a500024g"),
    "RTX6000-Ada": ("pro-card", "rtx6000adageneration 6000ada rtx6000ada48g"),
    "MI250X": ("dgx-v100", "mi250x64g mi250xgcd mi250xmi250"),  # 64 GiB host RAM per GCD, as Frontier
    "MI300X": ("oam-mi300x", "mi300x192g"),
    "MI325X": ("oam-mi300x", "mi325 mi325x256g"),
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


def node_class(name: str) -> str | None:
    """The reference node class a GPU type is sold in, where the catalog says."""
    return _EXTRA[name][0] if name in _EXTRA else None


def list_gpus() -> list[GpuType]:
    """All catalog entries, datacenter NVIDIA first, then PCIe / consumer cards, then AMD."""
    return list(_CATALOG)


def clip(text: str, width: int = 40) -> str:
    """User text echoed in an error, kept short enough for one line."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def lookup(name: str) -> tuple[GpuType, str | None] | None:
    hit = _LOOKUP.get(_key(name))
    return None if hit is None else (GPUS[hit[0]], hit[1])


def resolve_gpu(name: str) -> tuple[GpuType, str | None]:
    """Canonical GPU for any accepted spelling, and a note when an ambiguous name took a default."""
    if not name or not name.strip():
        raise InvalidSpecError("no GPU name given; write one such as A100-80GB (`ftlaunch gpus` lists them)")
    hit = lookup(name)
    if hit is None:
        import difflib  # only on the error path

        close = difflib.get_close_matches(_key(name), list(_LOOKUP), n=6, cutoff=0.6)
        names = list(dict.fromkeys(_LOOKUP[c][0] for c in close))[:3]
        hint = f"did you mean {' or '.join(names)}? " if names else ""
        raise UnknownGpuError(
            f"unknown GPU '{clip(name)}': {hint}`ftlaunch gpus` lists the known GPUs; "
            "or name the nearest one and set --gpu-memory to your card's memory"
        )
    return hit
