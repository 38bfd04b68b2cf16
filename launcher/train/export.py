"""Final weights that load: the consolidated 16-bit model (ZeRO-3 gathered, never the empty
placeholder) with its config and tokenizer, or the LoRA adapter; and the loss they give."""

from __future__ import annotations

from pathlib import Path

from launcher.spec import TrainSpec


def evaluate(engine, batches, device) -> float:
    """Loss on a fixed batch (step 0, micro-batch 0, rank 0's samples) in eval mode; collective."""
    import torch

    batch = {k: v.to(device) for k, v in batches.get(0, 0, 0)[0].items()}
    engine.eval()
    with torch.no_grad():
        loss = float(engine(**batch).loss.float())
    engine.train()
    return loss


def export_final(engine, model, tokenizer, spec: TrainSpec, out: Path, rank: int, shard_size: str = "5GB") -> None:
    """Collective: every rank calls it; rank 0 writes."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    if spec.trains_adapters:
        import deepspeed

        trainable = [p for p in model.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(trainable, enabled=spec.zero_stage == 3):
            if rank == 0:
                model.save_pretrained(str(out))
    else:
        if spec.tp > 1:
            # AutoTP: gather every rank's shards across the TP group (DeepSpeed 0.19's
            # consolidation, which its universal checkpoints use too)
            state = engine._consolidated_16bit_state_dict()
        elif spec.zero_stage == 3:
            # ZeRO-3: the partitions gathered layer by layer onto rank 0's CPU (what
            # save_16bit_model does under stage3_gather_16bit_weights_on_model_save)
            state = engine._zero3_consolidated_16bit_state_dict()
        else:
            state = engine.module_state_dict()
        if rank == 0:
            # safetensors (sharded with an index above transformers' shard size), tied weights
            # once, config and generation config beside them: what from_pretrained expects
            model.save_pretrained(str(out), state_dict=state, max_shard_size=shard_size)
    if rank == 0:
        tokenizer.save_pretrained(str(out))
    torch.distributed.barrier()


def merge_adapter(hf_config: dict, source: str, spec: TrainSpec, cfg, tokenizer, output: Path) -> None:
    """output/final-merged: the exported adapter (output/final) merged into a fresh 16-bit base --
    the pretrained weights, or the seeded random init every layout builds -- saved as one full
    model. A QLoRA adapter goes into the unquantised base, as the usual QLoRA recipe merges it."""
    import peft

    from launcher.train.model import build_model

    plain = spec.base_model(grad_ckpt="none", pp=1, tp=1)
    base = build_model(hf_config, source, plain, cfg.init, cfg.seed, 0.0)
    merged = peft.PeftModel.from_pretrained(base, str(output / "final")).merge_and_unload()
    merged.save_pretrained(str(output / "final-merged"), max_shard_size=cfg.max_shard_size)
    tokenizer.save_pretrained(str(output / "final-merged"))


DIGEST_MAX_PARAMS = 2**30  # ~4 GiB of fp32 to hash per rank; a 70B model would take minutes


def weights_digest(model, spec: TrainSpec) -> str | None:
    """sha256 over every (gathered) parameter: equal on all ranks when they agree on the weights,
    and equal between two runs exactly when their weights are bitwise equal. Collective under
    ZeRO-3. None under AutoTP (each rank holds different shards) and above DIGEST_MAX_PARAMS
    parameters, where hashing every weight on every rank would hold up the end of the run."""
    import hashlib

    import deepspeed

    params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if spec.tp > 1 or params > DIGEST_MAX_PARAMS:
        return None
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], enabled=spec.zero_stage == 3):
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
