"""Pipeline device maps: which GPU holds which module, balanced by the memory model.

`device_map(arch, spec, stages)` returns a Hugging Face `device_map` (module name -> GPU index),
written alone to device_map.json so that `from_pretrained(device_map=json.load(f))` takes the file
as it is, and the stage boundaries (first and last block of each stage) for multi-process pipeline
parallelism, written beside it (device_map_stages.json). Blocks are split into
contiguous stages so that the largest per-GPU memory is as small as it can be: each block
costs its weights, gradients, optimizer states and stored activations; the first stage also
holds the embeddings, the stage with the LM head its weights and the logits / loss working set.
Tied LM heads stay with the embeddings they share their weight with.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import InvalidSpecError
from launcher.memory import activations as A
from launcher.memory import edges as E
from launcher.memory import states as S
from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec

_LLAMA_LIKE = ("model", "layers", ["model.embed_tokens", "model.rotary_emb"], ["model.norm", "lm_head"])
LAYOUTS: dict[str, tuple[str, str, list[str], list[str]]] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "mixtral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
    "gemma2": _LLAMA_LIKE,
    "stablelm": _LLAMA_LIKE,
    "phi": (
        "model",
        "layers",
        ["model.embed_tokens", "model.rotary_emb", "model.embed_dropout"],
        ["model.final_layernorm", "lm_head"],
    ),
    "bloom": (
        "transformer",
        "h",
        ["transformer.word_embeddings", "transformer.word_embeddings_layernorm"],
        ["transformer.ln_f", "lm_head"],
    ),
    "falcon": (
        "transformer",
        "h",
        ["transformer.word_embeddings", "transformer.rotary_emb"],
        ["transformer.ln_f", "lm_head"],
    ),
    "gpt_neox": (
        "gpt_neox",
        "layers",
        ["gpt_neox.embed_in", "gpt_neox.emb_dropout", "gpt_neox.rotary_emb"],
        ["gpt_neox.final_layer_norm", "lm_head"],
    ),
    "gpt2": (
        "transformer",
        "h",
        ["transformer.wte", "transformer.wpe", "transformer.drop"],
        ["transformer.ln_f", "lm_head"],
    ),
    # original Qwen (remote code): module names of its modeling_qwen.py
    "qwen": (
        "transformer",
        "h",
        ["transformer.wte", "transformer.rotary_emb"],
        ["transformer.ln_f", "lm_head"],
    ),
}


def _opt_layout(arch: ModelArch) -> tuple[str, str, list[str], list[str]]:
    cfg = arch.hf_config
    first = ["model.decoder.embed_tokens", "model.decoder.embed_positions"]
    last = []
    if cfg.get("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False):
        last.append("model.decoder.final_layer_norm")
    proj = cfg.get("word_embed_proj_dim", arch.hidden)
    if proj != arch.hidden:
        first.append("model.decoder.project_in")
        last.append("model.decoder.project_out")
    return "model.decoder", "layers", first, last + ["lm_head"]


@dataclass(frozen=True)
class DeviceMap:
    device_map: dict[str, int]  # module name -> GPU index, in module order
    stages: list[tuple[int, int]]  # (first block, last block) per stage, inclusive
    stage_bytes: list[float]  # estimated peak bytes per GPU (before allocator margin)

    def stages_dict(self) -> dict:
        """The stage boundaries and estimates (device_map_stages.json, beside the map itself)."""
        return {
            "stages": [{"gpu": i, "first_layer": a, "last_layer": b} for i, (a, b) in enumerate(self.stages)],
            "estimated_gib": [round(b / 2**30, 3) for b in self.stage_bytes],
        }


def _states_bytes(arch: ModelArch, spec: TrainSpec, layers: int, first: bool, last: bool) -> float:
    p = S.stage_params(arch, spec, layers, first, last)
    st = S.model_states(spec, p, 1)
    return st.weights + st.grads + st.master + st.optimizer + st.fp32_grads


def _split(costs: list[float], first_extra: float, last_extra: float, parts: int) -> list[tuple[int, int]]:
    """Contiguous split of `costs` into `parts` non-empty stages minimising the largest stage
    (first stage adds first_extra, last adds last_extra). Dynamic programme, O(parts * n²)."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: minimal max cost splitting the first i blocks into k stages
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                stage = (
                    prefix[i] - prefix[j] + (first_extra if k == 1 else 0) + (last_extra if k == parts else 0)
                )
                worst = max(best[k - 1][j], stage)
                if worst < best[k][i]:
                    best[k][i], cut[k][i] = worst, j
    bounds, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        bounds.append((j, i - 1))
        i = j
    return bounds[::-1]


def device_map(arch: ModelArch, spec: TrainSpec, stages: int) -> DeviceMap:
    """Split the model over `stages` GPUs of one process (naive pipeline / model parallel)."""
    if arch.model_type == "opt":
        prefix, blocks, first, last = _opt_layout(arch)
    elif arch.model_type in LAYOUTS:
        prefix, blocks, first, last = LAYOUTS[arch.model_type]
    else:
        raise InvalidSpecError(f"no device-map layout for model type {arch.model_type!r}; use --pp 1")
    if not 1 <= stages <= arch.layers:
        raise InvalidSpecError(
            f"cannot split {arch.layers} layers over {stages} GPUs; use 1 to {arch.layers}"
        )
    single = spec.with_(tp=1, pp=1)
    targets = S.lora_targets(arch, single) if single.trains_adapters else set()
    layer_acts = A.stored_per_layer(arch, single, A.layer_activations(arch, single, targets), targets)
    per_layer = _states_bytes(arch, single, 1, False, False) + layer_acts
    embed_states = _states_bytes(arch, single, 0, True, False)
    embed = embed_states + E.edge_activations(arch, single, True, False)
    # final norm + untied LM head (a tied head shares the embedding's weight: counted once)
    head_states = _states_bytes(arch, single, 0, True, True) - embed_states
    head = head_states + E.edge_activations(arch, single, False, True) + E.logits_bytes(arch, single)
    tied = arch.lm_head_params == 0
    bounds = _split([per_layer] * arch.layers, embed + (head if tied else 0), 0.0 if tied else head, stages)
    out: dict[str, int] = {}
    for name in first:
        out[name] = 0
    for gpu, (a, b) in enumerate(bounds):
        for i in range(a, b + 1):
            out[f"{prefix}.{blocks}.{i}"] = gpu
    for name in last:
        out[name] = 0 if tied and name == "lm_head" else len(bounds) - 1
    sizes = []
    for gpu, (a, b) in enumerate(bounds):
        size = (b - a + 1) * per_layer
        if gpu == 0:
            size += embed + (head if tied else 0)
        if gpu == len(bounds) - 1 and not tied:
            size += head
        sizes.append(size)
    return DeviceMap(out, bounds, sizes)
