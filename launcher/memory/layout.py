"""Checks of a layout (TP, PP, hpZ degrees) against the model and the cluster, before any memory is
counted: one clear line for each way a layout cannot be split."""

from __future__ import annotations

from launcher.errors import InvalidSpecError
from launcher.memory import states as S
from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec


def check_parallelism(arch: ModelArch, spec: TrainSpec, world: int) -> int:
    """Validate TP/PP against the model and the cluster; return the data-parallel degree."""
    tp, pp = spec.tp, spec.pp
    if tp > 1 and arch.experts > 1:
        raise InvalidSpecError(
            f"--tp {tp}: {arch.name}'s experts are fused parameters (transformers >= 5), not nn.Linear "
            "layers, and DeepSpeed's AutoTP splits only nn.Linear; use --tp 1 with ZeRO-3 to shard them"
        )
    if arch.heads % tp or arch.kv_heads % tp:
        ok = [d for d in range(1, arch.kv_heads + 1) if arch.heads % d == 0 and arch.kv_heads % d == 0]
        raise InvalidSpecError(
            f"--tp {tp} does not divide {arch.name}'s {arch.heads} attention heads / "
            f"{arch.kv_heads} KV heads; use --tp {' or '.join(map(str, ok[-4:]))}"
        )
    S.layers_per_stage(arch.layers, pp)
    if world % (tp * pp):
        raise InvalidSpecError(
            f"--tp {tp} x --pp {pp} = {tp * pp} does not divide the {world} GPUs; "
            "pick degrees whose product divides the GPU count"
        )
    if world % spec.hpz:
        raise InvalidSpecError(
            f"--hpz {spec.hpz} does not divide the {world} GPUs; use the GPUs per node (or a divisor of them)"
        )
    return world // (tp * pp)


def check_tp_in_node(tp: int, gpus_per_node: int) -> None:
    """Tensor parallelism stays inside a node (its all-reduces run twice per block, forward and
    backward, over NVLink): tp must divide the node's GPUs."""
    if tp > gpus_per_node:
        raise InvalidSpecError(
            f"--tp {tp} is more than the {gpus_per_node} GPUs of a node; tensor parallelism stays inside a node"
        )
    if gpus_per_node % tp:
        raise InvalidSpecError(
            f"--tp {tp} does not divide the {gpus_per_node} GPUs of a node; use a divisor of {gpus_per_node}"
        )
