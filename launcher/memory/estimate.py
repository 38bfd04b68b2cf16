"""One configuration in, a per-GPU memory breakdown out: the analytic model the planner searches.

Peak per GPU is taken over the moments of a training step that compete for it:
  backward start: every saved activation and the logits/loss working set are alive, and only
                  the gradient buffers that persist (ZeRO-2/3 partitions, accumulation) exist;
  first block backward: one block's activations and its backward's working set, with every
                  other gradient not yet reduced away;
  backward end:   every gradient exists, with DeepSpeed's reduce copies of them (ZeRO-0's
                  flattened all-reduce bucket, ZeRO-1/2's partition buffer) or, with tied
                  embeddings, the LM head's and the embedding's gradients being summed;
  optimizer step: activations are gone; the gradients, the fp32 gradient and DeepSpeed's copies
                  made to step on them (launcher/memory/transients.py) exist.
persistent states (weights, master weights, optimizer states, ZeRO buffers) are there at both.
Under pipeline parallelism the first stage (most micro-batches in flight) and the last stage
(LM head and logits) are both evaluated and the larger is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.hardware import ClusterSpec
from launcher.memory import activations as A
from launcher.memory import constants as C
from launcher.memory import edges as E
from launcher.memory import states as S
from launcher.memory import transients as T
from launcher.memory.attention import EAGER_FOR_SDPA, attention_impl
from launcher.memory.host import host_and_nvme
from launcher.memory.layout import check_parallelism
from launcher.memory.memo import ArchMemo
from launcher.memory.pipeline import engine_buffers
from launcher.models.arch import ModelArch
from launcher.parallel.split import vocab_shards
from launcher.spec import PAGED_OPTIMIZERS, TrainSpec

# Order of the components in every table, chart and JSON object.
COMPONENTS = (
    "weights",
    "gradients",
    "master_weights",
    "optimizer_states",
    "activations",
    "logits_loss",
    "zero_buffers",
    "allocator_margin",
    "cuda_context_nccl",
)


@dataclass(frozen=True)
class Estimate:
    components: dict[str, float]  # bytes per GPU at the peak moment
    peak_allocated: float
    peak_reserved: float
    gpu_total: float  # reserved + memory outside PyTorch's allocator
    gpu_memory: float
    peak_phase: str
    host_components: dict[str, float]  # bytes per node
    host_per_node: float
    nvme_per_node: float
    params_total: int
    params_trainable: float  # on the whole model (before sharding)
    dp: int
    gradients_full: float  # all gradient bytes on this GPU at the optimizer step
    activations_per_layer: float
    notes: tuple[str, ...] = field(default=())
    paged_overflow: float = 0.0  # paged optimizer states paged out and in per step, bytes per GPU

    @property
    def fits(self) -> bool:
        return self.gpu_total <= self.gpu_memory

    def to_dict(self, cluster: ClusterSpec | None = None) -> dict:
        g = C.GIB
        out = {
            "per_gpu": {
                "peak_allocated_gib": round(self.peak_allocated / g, 3),
                "peak_reserved_gib": round(self.peak_reserved / g, 3),
                "total_gib": round(self.gpu_total / g, 3),
                "gpu_memory_gib": round(self.gpu_memory / g, 3),
                "peak_phase": self.peak_phase,
                "components": {k: round(v / g, 3) for k, v in self.components.items()},
                "gradients_at_step_gib": round(self.gradients_full / g, 3),
                "activations_per_layer_gib": round(self.activations_per_layer / g, 4),
            },
            "host_per_node_gib": round(self.host_per_node / g, 3),
            "host_components_gib": {k: round(v / g, 3) for k, v in self.host_components.items()},
            "nvme_gib": round(self.nvme_per_node / g, 3),
            "fits": self.fits,
            "params": {"total": self.params_total, "trainable": int(self.params_trainable)},
            "dp": self.dp,
            "notes": list(self.notes),
        }
        if cluster is not None:
            out["host_fits"] = self.host_per_node <= cluster.node.cpu_memory_gib * g
            out["nvme_fits"] = self.nvme_per_node <= cluster.node.nvme_gib * g
        return out


_SPLITS = ArchMemo()


def stage_split(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec, dp: int) -> list[int]:
    """Blocks per pipeline stage, balanced by this memory model (split.balanced_blocks): the first
    stage also holds the embeddings and the most micro-batches in flight, the last the LM head
    and the logits, so they take fewer blocks than the middle ones, as far as that keeps every
    stage as fast as the slowest of the split by layer count. Balanced at micro-batch 1
    with 1F1B's full depth in flight (pp - s on stage s), so one split serves every micro-batch
    and accumulation of a configuration: its host RAM is theirs, and its peak grows with the
    micro-batch (the planner's pruning relies on both). plan.json carries the split
    (pipeline_stages) and the worker trains exactly it. [layers] at pp 1."""
    from launcher.parallel.split import balanced_blocks

    if spec.pp == 1:
        return [arch.layers]
    S.layers_per_stage(arch.layers, spec.pp)
    ref = spec.with_(micro_batch=1, grad_accum=spec.pp)
    targets = S.lora_targets(arch, ref) if ref.trains_adapters else set()
    pp = spec.pp

    def peak(s: int, blocks: int) -> float:
        return _stage(arch, ref, cluster, dp, blocks, s == 0, s == pp - 1, pp - s, targets)[0]

    def split() -> tuple[int, ...]:
        block = S.stage_params(arch, ref, 1, False, False).total
        head = S.stage_params(arch, ref, 1, False, True).total - block  # matmul FLOPs go with params
        return tuple(balanced_blocks(arch.layers, pp, peak, head / block))

    return list(_SPLITS.get(arch, (ref, cluster, dp), split))


def _stage(arch, spec, cluster, dp, layers, first, last, inflight, targets):
    p = S.stage_params(arch, spec, layers, first, last)
    st = S.model_states(spec, p, dp, arch.hidden)
    window, bucket = S.zero_buffers(spec, arch, p)
    per_layer = A.layer_activations(arch, spec, targets)
    stored = layers * A.stored_per_layer(arch, spec, per_layer, targets) * inflight
    stored += E.edge_activations(arch, spec, first, last) * (inflight if first else 1)
    logits = E.logits_bytes(arch, spec) if last else 0.0
    # the pipeline engine's buffers stay through the whole backward (launcher/memory/pipeline.py)
    held, held_logits = engine_buffers(arch, spec, layers, first, last, inflight)
    stored += held
    # the loss's backward (logits working set) is over before the last block is recomputed and
    # runs its own backward
    after_loss = A.recompute_working_set(spec, per_layer) + A.backward_transient(arch, spec, per_layer)

    persistent_grads = st.grads if st.grads_persistent else 0.0
    persistent_fp32 = st.fp32_grads if st.fp32_grads_persistent else 0.0
    # a paged optimizer's states live in CUDA unified memory: on the GPU where there is room, paged
    # to host RAM by the driver where there is not (its step walks the states page by page), so
    # they are no part of the peak that must fit (estimate: paged_overflow)
    resident_opt = 0.0 if spec.optimizer in PAGED_OPTIMIZERS else st.optimizer
    base = st.weights + st.master + resident_opt + bucket
    # Three moments compete for the peak (bytes on top of `base`, by component):
    # all saved activations and the loss's working set (or, if larger, the last block's
    # recompute and backward after it); ZeRO-3's window of gathered parameters
    start = {
        "zero_buffers": window,
        "activations": stored,
        "logits_loss": logits + held_logits,
        "gradients": persistent_grads + persistent_fp32,
    }
    if after_loss > logits:
        start.update(activations=stored + after_loss, logits_loss=held_logits)
    moments_g = T.gradient_moments(arch, spec, p, st, dp, first, last)
    e = 4 if spec.precision == "fp32" else 2
    moments = {
        "backward start": start,
        "LM head backward": _head_backward(arch, spec, p, dp, last, window, stored, held_logits, persistent_grads + persistent_fp32),
        # the first block's backward (recomputed if checkpointed): every later block's gradient
        # already exists unless ZeRO-2/3 reduced it away; matters when attention is unfused
        # (ZeRO++ hpZ: the secondary weight shards of every module the backward has released)
        "first block backward": {
            "zero_buffers": window,
            "activations": A.first_block_backward(arch, spec, per_layer, targets) if first else 0.0,
            "gradients": st.grads + persistent_fp32,
            "secondary": st.secondary,
        },
        # every gradient made, and DeepSpeed's copies of them (launcher/memory/transients.py)
        # (ZeRO-3 has released all but the first module it gathered: the embedding)
        "backward end": {
            "zero_buffers": min(window, p.largest_module * e),
            "gradients": moments_g.backward_end,
            "secondary": st.secondary,
        },
        # gathered parameters released; the fp32 gradient and DeepSpeed's copies for the step
        "optimizer step": {"gradients": moments_g.optimizer_step, "secondary": st.secondary},
    }
    phase = max(moments, key=lambda k: sum(moments[k].values()))
    now = moments[phase]
    comps = {
        "weights": st.weights + now.get("secondary", 0.0),  # ZeRO++ hpZ's secondary shards, where made
        "gradients": now["gradients"],
        "master_weights": st.master,
        "optimizer_states": resident_opt,
        "activations": now.get("activations", 0.0),
        "logits_loss": now.get("logits_loss", 0.0),
        "zero_buffers": bucket + now.get("zero_buffers", 0.0),
    }
    allocated = base + sum(now.values())
    return allocated, comps, phase, st, p, per_layer.total, st.grads + st.fp32_grads


def _head_backward(arch, spec, p, dp, last, window, stored, held_logits, persistent) -> dict[str, float]:
    """The LM head's backward, once the loss's has left only the logits' gradient (in the compute
    dtype): every activation is still saved, and the head's weight gradient (trained under full
    fine-tuning; not split by tensor parallelism) and input gradient are made. Beats the loss's
    own working set below about hidden x 2 / 10 tokens per micro-batch. The chunked loss counts
    its head gradient in its own term (edges.logits_bytes). With the optimizer offloaded,
    DeepSpeed then takes the fp64 norm of the rank's piece of an untied head's gradient
    (transients.offload_norm), the logits' gradient gone and, under ZeRO-3, the head's gathered
    weight released; a tied head's gradient is reduced only with the embedding's, at the end."""
    if not last or E.chunked_loss(spec):
        return {"gradients": persistent}
    e = 4 if spec.precision == "fp32" else 2
    tokens = spec.micro_batch * spec.seq_len
    v = vocab_shards(spec.tp, spec.pp)
    elements = (arch.lm_head_params or arch.embed_matrix_params) / v if spec.method == "full" else 0.0
    grad = elements * S.trained_bytes(spec)
    made = {
        "zero_buffers": window,
        "activations": stored,
        "logits_loss": tokens * (arch.vocab / v + arch.hidden) * e + held_logits,
        "gradients": persistent + grad,
    }
    if not arch.lm_head_params:  # tied: the gradient is complete (and reduced) only at the embedding
        return made
    moments = [made]
    secondary = arch.lm_head_params * e / spec.hpz if spec.hpz > 1 and spec.zero_stage == 3 else 0.0
    if secondary:
        # ZeRO++ hpZ: releasing the head makes its secondary shard while its gathered weight is
        # still there, the logits' gradient already freed (measured: tests/test_zero_memory.py)
        moments.append({**made, "logits_loss": tokens * arch.hidden * e + held_logits, "secondary": secondary})
    norm = T.offload_norm(arch, spec, elements, p.trainable, dp)
    released = elements * e if spec.zero_stage == 3 else 0.0
    normed = {"zero_buffers": max(0.0, window - released), "activations": stored, "gradients": persistent + grad + norm}
    moments.append({**normed, "secondary": secondary} if secondary else normed)
    return max(moments, key=lambda m: sum(m.values()))


def estimate(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> Estimate:
    """The analytic per-GPU, per-node and NVMe memory of one configuration."""
    dp = check_parallelism(arch, spec, cluster.world_size)
    targets = S.lora_targets(arch, spec) if spec.trains_adapters else set()
    notes: list[str] = []
    impl = attention_impl(arch, spec)
    if impl == "eager" and spec.attention != "eager":
        if arch.model_type in EAGER_FOR_SDPA:
            notes.append(
                f"transformers runs {arch.model_type}'s soft-capped attention eager, not sdpa (s² scores per layer); "
                "counted as eager; --attention flash keeps it fused where flash-attn is installed"
            )
        else:
            notes.append(f"{arch.model_type} supports only eager attention in transformers; counted as eager")
    if impl == "math":
        notes.append(
            f"{arch.model_type}'s single K/V head makes sdpa fall back to its math kernel (fp32 scores, "
            "s² memory per layer); --attention flash avoids it where flash-attn is installed"
        )
    if spec.method == "qlora" and arch.experts > 1:
        notes.append(
            f"{arch.model_type}'s experts are fused parameters, not nn.Linear: bitsandbytes quantises "
            "only the attention linears, the experts stay in the compute dtype"
        )
    if S.adafactor_flattened(spec):
        notes.append(
            "Adafactor under DeepSpeed's mixed precision or ZeRO steps on flat 1-D partitions, so its "
            "second moment is not factored (4 B/param); fp32 with --zero-stage 0 keeps it factored"
        )
    pp = spec.pp
    best = None
    for s, layers in enumerate(stage_split(arch, spec, cluster, dp)):
        r = _stage(arch, spec, cluster, dp, layers, s == 0, s == pp - 1, min(pp - s, spec.grad_accum), targets)
        if best is None or r[0] > best[0]:
            best = r
    allocated, comps, phase, st, p, per_layer, grads_full = best

    reserved, gpu_total = device_figures(allocated, cluster.world_size)
    comps["allocator_margin"] = reserved - allocated
    comps["cuda_context_nccl"] = gpu_total - reserved

    host, nvme = host_and_nvme(arch, spec, st, cluster, dp, stage_split(arch, spec, cluster, dp))
    overflow = 0.0
    if spec.optimizer in PAGED_OPTIMIZERS:
        # what of the states cannot stay on the GPU beside the peak: paged out to host RAM and back
        # for every optimizer step (planner/perf.py counts the PCIe time)
        overflow = min(st.optimizer, max(0.0, gpu_total + st.optimizer - cluster.gpu_memory_gib * C.GIB))
        ranks = min(cluster.world_size, cluster.gpus_per_node)
        host["paged_states"] = overflow * ranks
        notes.append(
            f"{spec.optimizer}: {st.optimizer / C.GIB:.2f} GiB of optimizer states per GPU in unified memory, not "
            f"counted above: on the GPU where there is room, paged to host RAM where not ({overflow / C.GIB:.2f} "
            "GiB per GPU, out and back every step)"
        )
    trainable_total = S.trainable_params(arch, spec)
    return Estimate(
        components={k: comps[k] for k in COMPONENTS},
        peak_allocated=allocated,
        peak_reserved=reserved,
        gpu_total=gpu_total,
        gpu_memory=cluster.gpu_memory_gib * C.GIB,
        peak_phase=phase,
        host_components=host,
        host_per_node=sum(host.values()),
        paged_overflow=overflow,
        nvme_per_node=nvme,
        params_total=arch.total_params,
        params_trainable=trainable_total,
        dp=dp,
        gradients_full=grads_full,
        activations_per_layer=per_layer,
        notes=tuple(notes),
    )


def device_figures(allocated: float, world_size: int) -> tuple[float, float]:
    """(peak reserved, GPU total) for a peak allocated: the caching allocator's margin, then the
    CUDA context (and NCCL's buffers with more than one rank) outside the allocator."""
    reserved = allocated + max(allocated * C.ALLOCATOR_MARGIN_FRACTION, C.ALLOCATOR_MARGIN_MIN_GIB * C.GIB)
    outside = (C.CUDA_CONTEXT_GIB + (C.NCCL_BUFFERS_GIB if world_size > 1 else 0)) * C.GIB
    return reserved, reserved + outside


def stage_activations(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> list[float]:
    """Per pipeline stage, the bytes above its model states at its peak: activations (with the
    pipeline engine's buffers) and the logits + loss working set (tests/test_pipeline_memory.py
    measures them)."""
    dp = check_parallelism(arch, spec, cluster.world_size)
    targets = S.lora_targets(arch, spec) if spec.trains_adapters else set()
    out = []
    for s, blocks in enumerate(stage_split(arch, spec, cluster, dp)):
        inflight = min(spec.pp - s, spec.grad_accum)
        comps = _stage(arch, spec, cluster, dp, blocks, s == 0, s == spec.pp - 1, inflight, targets)[1]
        out.append(comps["activations"] + comps["logits_loss"])
    return out


def pipeline_stages(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> list[dict]:
    """Every pipeline stage of a plan as the worker lays it out: its blocks (launcher/parallel/
    split.py), the ranks and nodes holding it (pipe-major: stage s is ranks s*dp .. s*dp+dp-1, so
    a stage's data-parallel group is consecutive ranks and stages cross nodes), and its estimated
    peak per GPU. 1F1B keeps min(pp - s, accumulation) micro-batches in flight on stage s, so the
    first stage holds the most activations, the last the logits and loss. Empty below pp 2."""
    if spec.pp < 2:
        return []
    dp = check_parallelism(arch, spec, cluster.world_size)
    targets = S.lora_targets(arch, spec) if spec.trains_adapters else set()
    out, start, per_stage = [], 0, spec.tp * dp
    for s, blocks in enumerate(stage_split(arch, spec, cluster, dp)):
        first, last = s == 0, s == spec.pp - 1
        inflight = min(spec.pp - s, spec.grad_accum)
        allocated = _stage(arch, spec, cluster, dp, blocks, first, last, inflight, targets)[0]
        ranks = range(s * per_stage, (s + 1) * per_stage)
        out.append({
            "stage": s,
            "blocks": [start, start + blocks - 1],  # inclusive, as the model numbers its layers
            "embeddings": first,
            "lm_head": last,
            "micro_batches_in_flight": inflight,
            "ranks": [ranks[0], ranks[-1]],
            "nodes": sorted({r // cluster.gpus_per_node for r in ranks}),
            "gpu_total_gib": round(device_figures(allocated, cluster.world_size)[1] / C.GIB, 3),
        })
        start += blocks
    return out
