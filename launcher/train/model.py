"""Model loading for the worker: pretrained weights (hub id / local path) or a model built from
its config (catalog models in tests and demos), then the plan's method applied: LoRA / QLoRA via
peft (+ bitsandbytes, on the CPU too), activation checkpointing, attention kernel, precision."""

from __future__ import annotations

import copy

from launcher.errors import FtlaunchError
from launcher.spec import BNB_OPTIMIZERS, TrainSpec, tensor_parallel_conflict

ATTN = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}


class ModelLoadError(FtlaunchError):
    pass


def attention_impl_is_eager(model_type: str | None, attention: str) -> bool:
    """Families transformers runs eager where sdpa is asked (memory.attention.attention_impl)."""
    from launcher.memory.attention import EAGER_FOR_SDPA, EAGER_ONLY

    return model_type in EAGER_ONLY or (attention == "sdpa" and model_type in EAGER_FOR_SDPA)


def torch_dtype(precision: str):
    import torch

    return {
        "bf16": torch.bfloat16,
        "bf16-pure": torch.bfloat16,
        "bf16-autocast": torch.bfloat16,  # the frozen base; the adapters are made fp32 (build_model)
        "fp16": torch.float16,
        "fp32": torch.float32,
    }[precision]


def check_loadable(spec: TrainSpec, hf_config: dict, source: str, init: str, has_gpu: bool) -> None:
    """Problems that must stop the job before any rank starts."""
    if spec.pp > 1:
        from launcher.parallel.split import PIPELINE_ZERO0, pipeline_refusal

        why = pipeline_refusal(hf_config.get("model_type", "?"), source, bool(hf_config.get("alibi", False)))
        if why is not None:
            raise ModelLoadError(f"pp {spec.pp}: {why}")
        if spec.zero_stage != 1:
            raise ModelLoadError(f"pp {spec.pp} with ZeRO-{spec.zero_stage}: {PIPELINE_ZERO0}; plan again with --zero-stage 1")
        if spec.tp > 1:
            from launcher.models.hf_config import arch_from_hf_config
            from launcher.parallel.split import tensor_parallel_refusal

            arch = arch_from_hf_config(hf_config, source)
            why = tensor_parallel_refusal(arch.model_type, arch.heads, arch.kv_heads, arch.vocab, spec.tp)
            if why is not None:
                raise ModelLoadError(f"tp {spec.tp} x pp {spec.pp}: {source} {why}; plan again (tp 1)")
    if spec.packing:
        from launcher.models.hf_families import packing_refusal

        why = packing_refusal(hf_config.get("model_type", "?"))
        if why is not None:
            raise ModelLoadError(why)
    why = tensor_parallel_conflict(spec)
    if why is not None:
        raise ModelLoadError(f"tp {spec.tp}: {why}; plan again (tp 1)")
    if spec.method == "qlora" or spec.optimizer in BNB_OPTIMIZERS:
        from launcher.train.quantize import bitsandbytes_refusal

        why = bitsandbytes_refusal("QLoRA" if spec.method == "qlora" else f"--optimizer {spec.optimizer}")
        if why is not None:
            raise ModelLoadError(why)
    if spec.precision == "fp16" and not has_gpu and not cpu_runs_fp16():
        raise ModelLoadError(
            "--precision fp16 on CPU ranks: DeepSpeed's CPU accelerator trains fp16 only where oneDNN "
            "has fp16 kernels (AVX512-FP16 / AMX-FP16) and this CPU has none; use --precision bf16 or fp32"
        )
    if spec.attention == "flash" and not has_gpu:
        raise ModelLoadError("--attention flash needs an NVIDIA GPU with flash-attn; use --attention sdpa")
    if init == "pretrained":
        from launcher.models.hf_config import load_hf_config

        try:
            load_hf_config(source)
        except FtlaunchError as exc:
            raise ModelLoadError(
                f"cannot load model {source!r} offline: {exc}; pass a local path, or set training.init "
                "to 'random' to train from the config alone"
            ) from None


def cpu_runs_fp16() -> bool:
    """DeepSpeed's own test: its engine refuses fp16 on a CPU accelerator that says no (with a
    traceback in every rank). The answer follows oneDNN's kernels, so it differs between CPUs."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    return bool(CPU_Accelerator().is_fp16_supported())


def selective_checkpoint_context():
    """Per-op selective checkpointing (torchtitan's policy): keep every other matmul output and
    the outputs of whichever fused attention kernel runs, recompute the element-wise ops."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = {
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
    try:  # flash-attn >= 2.7 registers its kernel as a torch op (--attention flash)
        keep.add(torch.ops.flash_attn._flash_attn_forward.default)
    except (AttributeError, RuntimeError):
        pass
    counter = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs):
        if op in keep:
            return CheckpointPolicy.MUST_SAVE
        if op == torch.ops.aten.mm.default:
            # counted per pass: torch 2.13 replays the forward's decisions in the recompute,
            # but a policy consulted in both (older torch) must not see a shifted count
            mode = "recompute" if ctx.is_recompute else "forward"
            counter[mode] += 1
            return CheckpointPolicy.MUST_SAVE if counter[mode] % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def rank_model(run, spec: TrainSpec, ds_config: dict, rank: int, world: int, gpu: int | None):
    """The model this rank trains, loaded so that a node holds about one copy of the weights
    whatever its rank count (bench/host_loading.py measures it):
    - ZeRO-3: built under DeepSpeed's zero.Init (_zero3_model), so every parameter is
      partitioned as it is created; a checkpoint's tensors are then copied in, or a random init
      run, one module at a time; no rank holds the whole model. QLoRA is the exception (its
      quantised tensors are not partitioned as they are created): a checkpoint is quantised by
      transformers one shard at a time, a random init (demos) quantises a whole 16-bit model.
    - otherwise from a checkpoint: transformers memory-maps the safetensors; on a GPU each tensor
      goes straight to this rank's device, on CPU ranks the weights stay file pages until written,
      so the node's ranks share one copy in the page cache instead of reading one each.
    - pipeline ranks: only their own stage (launcher/train/weights.py).
    Returns (model, blocks per stage, the HfDeepSpeedConfig to keep alive or None)."""
    cfg = run.training
    hf_ds = None
    partitioned = spec.zero_stage == 3 and not (spec.method == "qlora" and cfg.init == "random")
    if partitioned:
        from transformers.integrations import HfDeepSpeedConfig

        hf_ds = HfDeepSpeedConfig(ds_config)
    blocks = _plan_blocks(run.plan, spec.pp, int(run.model.hf_config.get("num_hidden_layers", 0)))
    stage = (rank // (world // spec.pp), blocks) if spec.pp > 1 else None  # pipe-major (engines.Pipeline)
    device = f"cuda:{gpu}" if gpu is not None and spec.zero_stage != 3 and stage is None else None
    from launcher.train.weights import large_allocations_returned

    with large_allocations_returned():
        model = build_model(
            run.model.hf_config, run.model.source, spec, cfg.init, cfg.seed, cfg.lora_dropout, stage, device, partitioned
        )
    return model, blocks, hf_ds


def _plan_blocks(plan: dict, pp: int, layers: int) -> list[int]:
    """Blocks per pipeline stage as the plan shows them (plan.pipeline_stages, balanced by the
    memory model): the worker trains the split the plan counted."""
    if pp == 1:
        return [layers]
    stages = plan.get("pipeline_stages") or []
    blocks = [s["blocks"][1] - s["blocks"][0] + 1 for s in stages]
    if len(blocks) != pp or min(blocks, default=0) < 1 or (layers and sum(blocks) != layers):
        raise ModelLoadError(
            f"plan.json's pipeline_stages do not split the model's {layers} blocks into pp {pp} stages; "
            "plan again with this version of ftlaunch"
        )
    return blocks


def _zero3_model(config, dtype):
    """The model built under DeepSpeed's zero.Init, with the ZeRO-3 config of the HfDeepSpeedConfig
    rank_model keeps alive: each parameter is partitioned as its module is created and none is
    initialised (the caller copies a checkpoint in, or runs seeded_init, one module at a time).
    transformers' from_config under ZeRO-3 would first run its own init pass gathering every module
    on every rank, whose freed blocks glibc keeps: about one model copy per rank at the peak
    (bench/host_loading.py)."""
    import contextlib

    import deepspeed
    import transformers
    from transformers import initialization, modeling_utils
    from transformers.integrations import deepspeed as hf_deepspeed

    with (
        initialization.no_init_weights(),
        # RoPE's arange buffers keep their dtype (transformers >= 5.1; 5.0 had no such guard)
        getattr(hf_deepspeed, "prevent_arange_dtype_change", contextlib.nullcontext)(),
        deepspeed.zero.Init(config_dict_or_path=hf_deepspeed.deepspeed_config()),
        modeling_utils.set_zero3_state(),  # transformers does not enter zero.Init a second time
    ):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    return model


def build_model(
    hf_config: dict,
    source: str,
    spec: TrainSpec,
    init: str,
    seed: int,
    lora_dropout: float,
    stage: tuple[int, list[int]] | None = None,
    device: str | None = None,
    partitioned: bool = False,
):
    """The model a rank trains. `stage` (pipeline plans): (this rank's stage, blocks per stage);
    only that stage's modules are materialised (launcher/train/weights.py), the rest stay on the
    meta device. `device`: where a checkpoint's tensors go as they are read (CPU by default).
    `partitioned`: built under zero.Init (ZeRO-3, see rank_model)."""
    import torch
    import transformers

    from launcher.parallel.split import STAGE_READ_FAMILIES
    from launcher.train import quantize, weights

    dtype = torch_dtype(spec.precision)
    attn = "eager" if attention_impl_is_eager(hf_config.get("model_type"), spec.attention) else ATTN[spec.attention]
    cfg = copy.deepcopy(hf_config)  # transformers rewrites nested rope dicts in place
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = attn
    # QLoRA quantises what was built, in place (launcher/train/quantize.py); only a whole
    # pretrained model is quantised by transformers while it loads (one shard at a time)
    quantize_after = spec.method == "qlora" and (stage is not None or init == "random")
    if stage is not None:
        try:
            model = weights.stage_model(config, source, init, seed, stage[1], stage[0], dtype)
        except weights.StageLoadError as exc:
            raise ModelLoadError(str(exc)) from None
    elif init == "pretrained" and partitioned and spec.method != "qlora" and model_type in STAGE_READ_FAMILIES:
        model = _zero3_model(config, dtype)
        try:
            weights.load_partitioned(model, source)
        except weights.StageLoadError as exc:
            raise ModelLoadError(str(exc)) from None
    elif init == "random":
        if partitioned:
            model = _zero3_model(config, dtype)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        # the values a pipeline stage builds for the same names
        weights.seeded_init(model, seed, partitioned=partitioned)
    else:
        kwargs = {"dtype": dtype, "attn_implementation": attn}
        if device is not None:
            kwargs["device_map"] = {"": device}
        if spec.method == "qlora":
            kwargs["quantization_config"] = transformers.BitsAndBytesConfig(
                load_in_4bit=spec.quant == "nf4",
                load_in_8bit=spec.quant == "int8",
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
                bnb_4bit_quant_storage=dtype,
                llm_int8_threshold=quantize.INT8_THRESHOLD,
            )
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load model {source!r}: {str(exc).splitlines()[0]}") from None
    if quantize_after:
        head = model.get_output_embeddings()
        quantize.quantize_linears(model, spec.quant, dtype, keep={id(head)} if head is not None else set())
    if spec.method == "qlora":
        quantize.keep_training_layout(model)
    torch.manual_seed(seed)  # what draws next (LoRA's init) draws the same in every layout
    model.config.use_cache = False
    if spec.loss == "chunked":
        from launcher.train import chunked_loss

        chunked_loss.enable(model)
    if spec.grad_ckpt != "none":
        kwargs = {"use_reentrant": False}
        if spec.grad_ckpt == "selective":
            kwargs["context_fn"] = selective_checkpoint_context
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if spec.trains_adapters:
        import peft

        # the frozen base stays in the compute dtype (peft's prepare_model_for_kbit_training would
        # upcast it to fp32, which DeepSpeed's mixed precision casts straight back)
        if spec.grad_ckpt != "none":
            model.enable_input_require_grads()
        lora = peft.LoraConfig(
            r=spec.lora_r,
            lora_alpha=spec.lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=peft_targets(model, spec),
            task_type="CAUSAL_LM",
        )
        # adapters in the base layers' (compute) dtype, as DeepSpeed would cast them anyway; not
        # by casting the model afterwards, which would also round RoPE's fp32 inv_freq buffers
        model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
        if spec.precision == "bf16-autocast":
            for p in model.parameters():  # fp32 adapters, as PEFT + bitsandbytes recipes train them
                if p.requires_grad:
                    p.data = p.data.float()
    if spec.compile:
        compile_blocks(model)
    return model


def compile_blocks(model) -> int:
    """torch.compile every transformer block in place (nn.Module.compile: the module, its parameter
    names, DeepSpeed's hooks and the checkpoint layout stay as they are; only the block's forward runs
    compiled), as torchtune and torchtitan compile per block: one graph per block class, reused by
    every layer. The blocks are the classes transformers will not split across devices
    (`_no_split_modules`). Returns how many were compiled."""
    from launcher.parallel.stages import causal_lm

    lm = causal_lm(model)
    names = set(getattr(lm, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:  # every family in the catalog names its block; a custom model may not
        raise ModelLoadError(
            f"--compile: {type(lm).__name__} names no transformer block class (_no_split_modules) to compile; "
            "plan without --compile"
        )
    for block in blocks:
        block.compile()
    return len(blocks)


def peft_targets(lm, spec: TrainSpec):
    """PEFT's target_modules for --lora-targets: block linears by their leaf names, `all-linear` as
    PEFT has it (every nn.Linear / Conv1D but the LM head), and embed_tokens / lm_head as the
    model's own input-embedding and head modules, whatever the family calls them."""
    import torch
    from transformers.pytorch_utils import Conv1D

    wanted = spec.lora_target_list()
    modules = {"embed_tokens": lm.get_input_embeddings(), "lm_head": lm.get_output_embeddings()}
    edges = [next(n for n, m in lm.named_modules() if m is modules[t]) for t in wanted if t in modules]
    if "all-linear" not in wanted:
        return [t for t in wanted if t not in modules] + edges
    if not edges:
        return "all-linear"
    head = modules["lm_head"]
    linears = [n for n, m in lm.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head]
    return sorted(set(linears) | set(edges))
