"""Per-GPU peak memory as three public estimators predict it, for one training configuration.

Each function takes our (ModelArch, TrainSpec, ClusterSpec), describes the configuration to the
tool as faithfully as the tool's own knobs allow, calls the tool's own code (offline, no network,
no files written) and returns what the tool would show a user as the per-GPU figure:

    deepspeed     DeepSpeed 0.19's `estimate_zero{2,3}_model_states_mem_needs`: model states only
    accelerate    `accelerate estimate-memory`'s "Training using Adam" column (accelerate 1.15)
    llm_analysis  llm-analysis 0.2.2 `LLMAnalysis.training()` "(weight+op_state+grad+act)_memory_per_gpu"

`Other.gib` is None where the tool cannot describe the configuration; `Other.note` says what was
compared or why not. A tool's error becomes `Other(None, "failed: ...")`; nothing here raises.

    python bench/other_estimators.py     prints the three beside ours for a few configurations
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from launcher.hardware import ClusterSpec  # noqa: E402
from launcher.models.arch import ModelArch  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402

GIB = 2**30


@dataclass
class Other:
    gib: float | None  # predicted peak per GPU in GiB (2**30), None when the tool does not apply
    note: str  # one short line: what was compared, or why it does not apply


def _failed(e: Exception) -> Other:
    line = (str(e).strip().splitlines() or [""])[0][:160]
    return Other(None, f"failed: {type(e).__name__}: {line}".rstrip(": "))


# ---- DeepSpeed ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _ds_cpu_accelerator():
    """DS_ACCELERATOR=cpu while DeepSpeed is first imported, then the environment as it was
    (so subprocesses a caller starts later are not forced onto the CPU accelerator)."""
    old = os.environ.get("DS_ACCELERATOR")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DS_ACCELERATOR", None)


def largest_module_params(arch: ModelArch) -> int:
    """The largest parameter count held by one module itself, as DeepSpeed's `model_to_params`
    (stage3.py) takes it from a live model: max over modules of sum(p.numel() for
    p in m.parameters(recurse=False)). Candidates: the embedding (and an untied LM head), each
    linear (weight + bias), and for MoE the fused experts module (transformers 5 keeps all
    experts' gate_up_proj and down_proj as 3-D parameters of one module)."""
    candidates = [arch.vocab * arch.hidden]
    candidates += [lin.params // lin.count for lin in arch.linears if lin.count == 1]
    experts = sum(lin.params for lin in arch.linears if lin.count > 1)
    candidates.append(experts)
    return max(candidates)


def deepspeed(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> Other:
    """DeepSpeed's own estimator: GPU bytes for fp16 params, grads and fp32 Adam states.

    Counts (per GPU, N = all parameters): ZeRO-2 `2N + 18N/gpus` (no offload) or `2N` (optimizer
    offloaded); ZeRO-3 `4*largest_module + 18N/gpus`, `4*largest + 2N/gpus` (optimizer offloaded)
    or `4*largest` (params and optimizer offloaded). Omits activations, logits, temporary buffers,
    the CUDA context and allocator slack; assumes mixed precision with Adam and every parameter
    trainable (a LoRA user would still pass the total). It has no stage-1 or stage-0 formula: we
    use the ZeRO-2 one for stage 1 and 2, and for stage 0 the ZeRO-2 one over a single GPU (which
    is exactly unsharded: 20N). No notion of TP/PP: None there.
    """
    try:
        if spec.tp * spec.pp > 1:
            return Other(None, "no TP/PP in DeepSpeed's estimator")
        with _ds_cpu_accelerator():
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        n = arch.total_params
        opt_off = spec.offload_optimizer != "none"
        if spec.zero_stage == 3:
            largest = largest_module_params(arch)
            _, gpu, _ = estimate_zero3_model_states_mem_needs(
                total_params=n,
                largest_layer_params=largest,
                num_gpus_per_node=cluster.gpus_per_node,
                num_nodes=cluster.nodes,
                cpu_offload=opt_off,
                cpu_offload_params=spec.offload_params != "none",
                zero_init=True,  # only changes the CPU figure
            )
            what = f"ZeRO-3 formula over {cluster.world_size} GPU(s), largest module {largest / 1e6:.0f}M"
        elif spec.zero_stage == 0:
            _, gpu = estimate_zero2_model_states_mem_needs(
                total_params=n, num_gpus_per_node=1, num_nodes=1, cpu_offload=False
            )
            what = "ZeRO-0 as the ZeRO-2 formula over 1 GPU (nothing sharded)"
        else:
            _, gpu = estimate_zero2_model_states_mem_needs(
                total_params=n,
                num_gpus_per_node=cluster.gpus_per_node,
                num_nodes=cluster.nodes,
                cpu_offload=opt_off,
            )
            what = f"ZeRO-2 formula (stage {spec.zero_stage}) over {cluster.world_size} GPU(s)"
        extra = []
        if opt_off or spec.offload_params != "none":
            nvme = "nvme" in (spec.offload_optimizer, spec.offload_params)
            extra.append("offload to " + ("nvme, taken as cpu" if nvme else "cpu"))
        if spec.offload_params != "none" and not opt_off:
            extra.append("its formula ignores param offload without optimizer offload")
        if spec.method != "full":
            extra.append("counts every parameter as trainable")
        if spec.precision in ("fp32", "bf16-pure") or spec.optimizer != "adamw":
            extra.append("assumes mixed-precision Adam")
        note = f"{what}; model states only, activations not modelled"
        return Other(gpu / GIB, "; ".join([note, *extra]))
    except Exception as e:  # a tool's failure is a result here
        return _failed(e)


# ---- accelerate ---------------------------------------------------------------------------------

_ACCELERATE_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "bf16-pure": "bfloat16"}


def accelerate(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> Other:
    """`accelerate estimate-memory`'s "Training using Adam" figure for the run's precision.

    The command builds the model empty in fp32, takes `total_size` = 4 bytes x parameters, and
    per dtype row calls `estimate_training_usage(total_size, dtype)`, which returns the sizes of
    model, gradients, optimizer and step (fp32: 4N, 4N, 8N, 16N; fp16/bf16 mixed: 4N, 6N, 8N, 8N
    bytes); the column shows max() of those, i.e. the largest single component, not their sum.
    We pass 4 x arch.total_params (the command itself loads AutoModel, which has no LM head, so
    for untied models it would count vocab x hidden fewer). No batch, sequence, activations,
    LoRA, ZeRO, offload or parallelism: one GPU, full training, whatever the configuration.
    QLoRA: its int4 row has no training figure; we show the compute-precision row.
    """
    try:
        from accelerate.commands.estimate import estimate_training_usage

        dtype = _ACCELERATE_DTYPE[spec.precision]
        sizes = estimate_training_usage(4 * arch.total_params, dtype)
        peak = max(sizes.values())
        if peak == -1:
            return Other(None, f"no training figure for {dtype}")
        extra = ["no batch/sequence/sharding terms"]
        if spec.method != "full":
            extra.append(f"assumes full training ({spec.method} not modelled)")
        if spec.precision == "bf16-pure":
            extra.append("no pure-bf16 mode: mixed-precision row")
        note = f"'{dtype}' row: max(model, grads, Adam, step) for one GPU"
        return Other(peak / GIB, "; ".join([note, *extra]))
    except Exception as e:
        return _failed(e)


# ---- llm-analysis -------------------------------------------------------------------------------

# Our GPU names -> llm-analysis gpu_configs entries (the GPU only sets the capacity it checks the
# total against, and the latency figures; the memory total does not depend on it).
_LLMA_GPU = {
    "A100-40GB": "a100-sxm-40gb",
    "A100-80GB": "a100-sxm-80gb",
    "H100-80GB": "h100-sxm-80gb",
    "H100-PCIe": "h100-pcie-80gb",
    "V100-16GB": "v100-sxm-16gb",
    "V100-32GB": "v100-sxm-32gb",
    "A10G": "a10g-pcie-24gb",
    "RTX-A6000": "a6000-48gb",
}
_LLMA_FALLBACK_GPU = "a100-sxm-80gb"

# Optimizer-state bytes per parameter (llm-analysis `other_op_bytes`, Adam's 8 is its default),
# mixed precision / pure bf16, as our memory model takes them.
_LLMA_STATE_BYTES = {"adamw": (8, 4), "adamw-8bit": (2, 2), "sgd": (4, 2)}


def _llma_model_config(arch: ModelArch, seq_len: int):
    """A llm-analysis ModelConfig from our arch (never from the hub).

    Its parameter model is 2 MLP matrices of ffn_embed_dim and hidden-sized Q and O; for gated
    MLPs (SwiGLU) its own convention is the iso-parameter width (see its `recompute_gelu and
    gated_linear_units` branch: "swiglu decreases the expansion ratio by 2/3"), so we pass
    1.5 x intermediate_size, which makes its MLP parameter count exact. expansion_ratio is passed
    explicitly because it asserts ffn % hidden == 0 otherwise (false for most models).
    """
    from llm_analysis.config import ModelConfig

    ffn = arch.ffn * 3 // 2 if arch.gated_mlp else arch.ffn
    return ModelConfig(
        name=arch.name,
        num_layers=arch.layers,
        n_head=arch.heads,
        hidden_dim=arch.hidden,
        vocab_size=arch.vocab,
        max_seq_len=max(arch.max_positions or 0, seq_len),
        num_key_value_heads=arch.kv_heads,
        ffn_embed_dim=ffn,
        expansion_ratio=ffn / arch.hidden,
        model_type=arch.model_type,
        moe_num_experts=arch.experts,
        moe_top_k=arch.experts_per_token if arch.experts > 1 else 1,
    )


def llm_analysis(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> Other:
    """llm-analysis' training analysis: the summary's "(weight+op_state+grad+act)_memory_per_gpu".

    Counts per GPU: 16-bit weights (/tp, /pp, /dp under ZeRO-3), fp32 gradients (/dp from ZeRO-2)
    and optimizer states = fp32 master + Adam's 8 bytes (/dp from ZeRO-1), plus activations
    (Korthikanti et al. 2022: attention, MLP, layernorms per layer x all layers, flash or s^2
    attention scores, dropout masks, full/selective recomputation) and the logits. Omits LoRA,
    offload, the CUDA context and allocator slack, temporary buffers, biases, an untied LM head's
    weights (it always counts one shared embedding) and head_dim x heads != hidden. For MoE it
    multiplies the MLP activations by all local experts x top_k. Megatron-style sequence
    parallelism is its default with TP; we set sp_size=1 (ours has none).
    """
    try:
        if spec.method != "full":
            return Other(None, "full fine-tuning only (no LoRA/QLoRA)")
        if spec.precision == "fp32":
            return Other(None, "no fp32: its dtype configs are 16/8/4-bit")
        if spec.offload_optimizer != "none" or spec.offload_params != "none":
            return Other(None, "no CPU/NVMe offload in llm-analysis")
        if spec.optimizer not in _LLMA_STATE_BYTES:
            return Other(None, f"no {spec.optimizer} (per-parameter optimizer bytes only)")
        with warnings.catch_warnings():  # its CLI dependency `fire` imports the deprecated `pipes`
            warnings.simplefilter("ignore", DeprecationWarning)
            import llm_analysis.config as lc
            from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
            from llm_analysis.config import ParallelismConfig
            from llm_analysis.logger import logger

        gpu_name = _LLMA_GPU.get(cluster.gpu.name)
        gpu = lc.get_gpu_config_by_name(gpu_name or _LLMA_FALLBACK_GPU)
        if gpu_name is None:  # timing entry of an A100, capacity of the real GPU
            gpu = dataclasses.replace(gpu, mem_per_GPU_in_GB=cluster.gpu.memory_gib)
        capacity = gpu.mem_per_GPU_in_GB * 1024**3  # it multiplies its "GB" by 1024**3
        # It asserts micro_batch <= the largest batch that fits; the total does not depend on the
        # capacity, so give it room and compare against the real capacity ourselves.
        roomy = dataclasses.replace(gpu, mem_per_GPU_in_GB=1e9)

        mixed_states, pure_states = _LLMA_STATE_BYTES[spec.optimizer]
        if spec.precision == "bf16-pure":
            # It counts master_weights_dtype_bytes twice: as the gradient, and inside the optimizer
            # (master + other_op_bytes). Pure bf16 has bf16 gradients and no master copy, so
            # master=2, other=states-2 gives gradients + optimizer = 2 + pure_states bytes.
            master, other = 2, pure_states - 2
        else:  # fp16/bf16 mixed: fp32 gradients and master copy, as its default
            master, other = 4, (None if spec.optimizer == "adamw" else mixed_states)
        recompute = {
            "none": ActivationRecomputation.NONE,
            "selective": ActivationRecomputation.SELECTIVE,
            "full": ActivationRecomputation.FULL,
        }[spec.grad_ckpt]
        dp = cluster.world_size // (spec.tp * spec.pp)
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            analysis = LLMAnalysis(
                _llma_model_config(arch, spec.seq_len),
                roomy,
                lc.get_dtype_config_by_name("w16a16e16"),
                ParallelismConfig(tp_size=spec.tp, pp_size=spec.pp, dp_size=dp, sp_size=1),
            )
            summary = analysis.training(
                batch_size_per_gpu=spec.micro_batch,
                gradient_accumulation_steps=spec.grad_accum,
                seq_len=spec.seq_len,
                activation_recomputation=recompute,
                ds_zero=DSZeRO(spec.zero_stage),
                master_weights_dtype_bytes=master,
                other_op_bytes=other,
                flash_attn=spec.attention != "eager",
                mlp_gated_linear_units=arch.gated_mlp,
                output_dir=None,  # writes no files
            )
        finally:
            logger.setLevel(level)
        total = summary["(weight+op_state+grad+act)_memory_per_gpu"]
        note = (
            f"weights+grads+optimizer+activations, ZeRO-{spec.zero_stage} dp={dp} tp={spec.tp} pp={spec.pp}; "
            f"it counts {summary['num_params_total'] / 1e9:.3g}B params"
        )
        if gpu_name is None:
            note += f"; {cluster.gpu.name} not in its GPUs, A100 timing used"
        if total > capacity:
            note += f"; it says: does not fit {gpu.mem_per_GPU_in_GB:g} GB"
        return Other(total / GIB, note)
    except Exception as e:
        return _failed(e)


ESTIMATORS = {"deepspeed": deepspeed, "accelerate": accelerate, "llm-analysis": llm_analysis}


def compare(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec) -> dict[str, Other]:
    """All three for one configuration."""
    return {name: fn(arch, spec, cluster) for name, fn in ESTIMATORS.items()}


def main() -> None:
    from launcher.hardware import parse_gpus
    from launcher.memory.estimate import estimate
    from launcher.models.catalog import resolve_model

    rows = [
        ("llama-3.2-1b", "1xA100-80GB", TrainSpec()),
        ("llama-3.2-1b", "8xA100-80GB", TrainSpec(zero_stage=2)),
        ("llama-3.2-1b", "8xA100-80GB", TrainSpec(zero_stage=3)),
        ("llama-3.2-1b", "1xA100-80GB", TrainSpec(method="lora")),
        ("llama-3.2-1b", "8xA100-80GB", TrainSpec(tp=2)),
        ("llama-3.1-8b", "8xH100-80GB", TrainSpec(zero_stage=3, grad_ckpt="full", seq_len=4096)),
        (
            "llama-3.1-8b",
            "8xH100-80GB",
            TrainSpec(zero_stage=3, offload_optimizer="cpu", offload_params="cpu", grad_ckpt="full"),
        ),
    ]
    head = f"{'model':13} {'gpus':12} {'config':34} {'ours':>7} {'deepspeed':>9} {'accelerate':>10} {'llm-anal.':>9}"
    print(head)
    print("-" * len(head))
    notes = []
    for model, gpus, spec in rows:
        arch, cluster = resolve_model(model), parse_gpus(gpus)
        ours = estimate(arch, spec, cluster).peak_allocated / GIB
        got = compare(arch, spec, cluster)
        cfg = f"{spec.method} {spec.precision} z{spec.zero_stage} tp{spec.tp} mb{spec.micro_batch} s{spec.seq_len} ckpt={spec.grad_ckpt}"
        if spec.offload_optimizer != "none":
            cfg += " off"
        cells = [f"{o.gib:.2f}" if o.gib is not None else "-" for o in got.values()]
        print(f"{model:13} {gpus:12} {cfg:34} {ours:7.2f} {cells[0]:>9} {cells[1]:>10} {cells[2]:>9}")
        notes += [f"  {model} {gpus} {cfg} | {k}: {o.note}" for k, o in got.items()]
    print("\n".join(["", "GiB per GPU; notes:", *notes]))


if __name__ == "__main__":
    main()
