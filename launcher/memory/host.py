"""Host RAM of the busiest node and NVMe bytes of one configuration: what ranks offload, the pinned
buffers DeepSpeed allocates for it, and what a rank copies on the host while the model loads
(launcher/memory/estimate.py reports them beside the GPU figures)."""

from __future__ import annotations

from launcher.hardware import ClusterSpec
from launcher.memory import constants as C
from launcher.memory import states as S
from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec


def host_and_nvme(
    arch: ModelArch, spec: TrainSpec, st: S.States, cluster: ClusterSpec, dp: int, split: list[int]
) -> tuple[dict, float]:
    """Host RAM of the busiest node: per rank a baseline plus the larger of its offloaded states
    and what it copies on the host while the model loads (loading is over before the optimizer's
    offloaded states exist). Ranks are pipe-major, so a node's ranks may hold different stages."""
    per_stage = [(loading(arch, spec, arch.total_params), st.host)]
    if spec.pp > 1:
        per_stage = []
        for s, n in enumerate(split):
            p = S.stage_params(arch, spec, n, s == 0, s == spec.pp - 1)
            per_stage.append((loading(arch, spec, p.total), S.model_states(spec, p, dp).host))
    g, per = cluster.gpus_per_node, spec.tp * dp
    best = None
    for node in range(-(-cluster.world_size // g)):
        held = [per_stage[min(r // per, len(per_stage) - 1)] for r in range(node * g, min((node + 1) * g, cluster.world_size))]
        host = {
            "baseline": C.HOST_BASELINE_PER_RANK_GIB * C.GIB * len(held),
            "offloaded_states": sum(off for _, off in held),
            "model_loading": sum(max(0.0, load - off) for load, off in held),
        }
        if best is None or sum(host.values()) > sum(best.values()):
            best = host
    return best, st.nvme * min(cluster.world_size, cluster.gpus_per_node)


def loading(arch: ModelArch, spec: TrainSpec, stage_params: float) -> float:
    """Bytes one rank copies on the host while the model loads (launcher/train/model.rank_model;
    bench/host_loading.py measures it). Not counted: the checkpoint's pages the ranks map, which
    are the page cache's (one copy per node, however many ranks map them), clean, and given back
    by the kernel under pressure, so they never make a load fail. A pipeline rank reads its
    stage's tensors by name (launcher/train/weights.py) in the compute dtype, for the families
    whose checkpoints match transformers' names; ZeRO-3 reads one module at a time into the
    partitions for those families (rank 0 copies the largest module, the embedding, at most);
    everything else is transformers' from_pretrained: the safetensors (stored in the compute dtype,
    as published checkpoints are) memory-mapped, each tensor
    going to the rank's GPU (or quantised on the way, QLoRA) and, under ZeRO-3 for the other
    families, every file kept mapped by rank 0 to the end."""
    from launcher.parallel.split import STAGE_READ_FAMILIES

    e = 4 if spec.precision == "fp32" else 2
    by_name = arch.model_type in STAGE_READ_FAMILIES
    if spec.pp > 1 and by_name:
        return stage_params * e
    if spec.zero_stage == 3 and by_name and spec.method != "qlora":
        return arch.embed_matrix_params * e
    return 0.0
