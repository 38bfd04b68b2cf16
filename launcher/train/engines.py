"""The two DeepSpeed engines the worker trains under, behind one small interface: build, step,
evaluate, export, digest. The loop (loop.py) owns everything else -- data order, checkpoints,
preemption, logging -- and never asks which engine it drives.

- DataParallel: DeepSpeed's engine for ZeRO-0..3 and AutoTP (pp 1), one micro-batch at a time.
- Pipeline: DeepSpeed's pipeline engine (1F1B over `grad_accum` micro-batches per step) on the
  stages of launcher/parallel/stages.py, ZeRO-0/1, with tensor-parallel layers inside the stages
  when tp > 1 (launcher/parallel/tensor.py). Ranks are laid out pipe, data, model (rank =
  (stage * dp + dp_rank) * tp + tp_rank): a TP group is consecutive ranks, inside a node, and a
  stage's ranks are consecutive too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from launcher.spec import TrainSpec
from launcher.train import export
from launcher.train.data import labelled


class DataParallel:
    def __init__(self, model, params, spec: TrainSpec, ds_config: dict, optimizer_for, schedule, rank: int, world: int):
        import deepspeed

        self.ds, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=params,
            config=ds_config,
            optimizer=optimizer_for(params),
            lr_scheduler=schedule,
        )
        self.model, self.spec, self.world = model, spec, world
        self.dp_rank = rank // spec.tp  # AutoTP groups are consecutive ranks
        if spec.optimizer_step == "in-backward":
            # the optimizer averages each gradient as it comes and frees it (in_backward.py); the
            # engine's all-reduce after the backward would find none (and zero-fill them all)
            self.ds.enable_backward_allreduce = False

    def step(self, batches, step: int) -> tuple[float, int]:
        """One optimizer step: (the step's mean loss over every rank, this rank's real tokens)."""
        import torch

        losses, tokens = [], 0
        for micro in range(self.spec.grad_accum):
            inputs, real_tokens = batches.get(step, micro, self.dp_rank)
            loss = self.ds(**{k: v.to(self.ds.device) for k, v in inputs.items()}).loss
            self.ds.backward(loss)
            self.ds.step()
            losses.append(loss.detach().float())
            tokens += real_tokens
        mean = torch.stack(losses).mean()
        torch.distributed.all_reduce(mean)
        return float(mean) / self.world, tokens

    def evaluate(self, batches) -> float:
        return export.evaluate(self.ds, batches, self.ds.device)

    def eval_loss(self, batches: list[dict]) -> tuple[float, int]:
        """(mean loss per labelled token, labelled tokens) over the evaluation set: each rank's
        micro-batches (data.eval_batches) weighted by their labelled tokens. Collective."""
        import torch

        total = torch.zeros(2, dtype=torch.float64)
        self.ds.eval()
        with torch.no_grad():
            for inputs in batches:
                loss = self.ds(**{k: v.to(self.ds.device) for k, v in inputs.items()}).loss
                count = labelled(inputs["labels"])
                if count:  # a batch of filler rows only has no loss (0 / 0)
                    total += torch.tensor([float(loss) * count, count], dtype=torch.float64)
        self.ds.train()
        return _mean(total, self.ds.device, replicas=self.spec.tp)  # a TP group's ranks see the same rows

    def export(self, tokenizer, out: Path, rank: int, shard_size: str) -> None:
        export.export_final(self.ds, self.model, tokenizer, self.spec, out, rank, shard_size)

    def digest(self) -> str | None:
        return export.weights_digest(self.model, self.spec)


class Pipeline:
    def __init__(self, model, spec: TrainSpec, ds_config: dict, optimizer_for, schedule, rank: int, world: int,
                 blocks: list[int]):
        import deepspeed

        from launcher.parallel.stages import pipeline_module

        module = pipeline_module(model, blocks, spec.tp)
        local = {id(p) for p in module.parameters()}
        params = [p for p in model.parameters() if p.requires_grad and id(p) in local]  # this shard's
        self.ds, _, _, _ = deepspeed.initialize(
            model=module,
            model_parameters=params,
            config=ds_config,
            optimizer=optimizer_for(params),
            lr_scheduler=schedule,
        )
        self.model, self.spec = model, spec
        self.dp = world // (spec.pp * spec.tp)
        self.dp_rank = rank // spec.tp % self.dp
        self.tp_rank = rank % spec.tp
        # this stage's parameters by their Hugging Face names (the model's own modules)
        self.local = [(n, p) for n, p in model.named_parameters() if id(p) in local]

    def step(self, batches, step: int) -> tuple[float, int]:
        micro = [batches.get(step, m, self.dp_rank) for m in range(self.spec.grad_accum)]
        feed = iter([(inputs["input_ids"], inputs["labels"]) for inputs, _ in micro])
        loss = self.ds.train_batch(feed)  # mean over the global batch, on every stage
        return float(loss), sum(tokens for _, tokens in micro)

    def eval_loss(self, batches: list[dict]) -> tuple[float, int]:
        """As DataParallel.eval_loss; the last stage's ranks hold the losses (not averaged over the
        data-parallel group, which would weigh a rank's rows by another's token count)."""
        import torch

        total = torch.zeros(2, dtype=torch.float64)
        for inputs in batches:
            feed = iter([(inputs["input_ids"], inputs["labels"])])
            out = self.ds.eval_batch(feed, num_micro_batches=1, reduce_output=None, bcast_loss=False)
            count = labelled(inputs["labels"])
            if count and self.ds.is_last_stage():
                total += torch.tensor([float(out[0]) * count, count], dtype=torch.float64)
        self.ds.train()
        return _mean(total, self.ds.device, replicas=self.spec.tp)  # a TP group's ranks hold the same loss

    def evaluate(self, batches) -> float:
        """Loss on the fixed batch the data-parallel engine evaluates (step 0, micro-batch 0,
        data-parallel rank 0's samples), every stage taking part."""
        inputs = batches.get(0, 0, 0)[0]
        loss = self.ds.eval_batch(iter([(inputs["input_ids"], inputs["labels"])]), num_micro_batches=1)
        self.ds.train()
        return float(loss)

    def export(self, tokenizer, out: Path, rank: int, shard_size: str) -> None:
        """ONE Hugging Face model directory, gathered from the stages without any rank holding
        the whole model: each stage's first data-parallel rank writes its own safetensors shard
        (model-0000s-of-0000p, whatever `shard_size`) and rank 0 the index, config and tokenizer. LoRA: the adapter
        alone (small), sent to rank 0, which saves it as one PEFT adapter. Collective."""
        import torch

        from launcher.parallel.stages import causal_lm

        out.mkdir(parents=True, exist_ok=True)
        stage = rank // (self.dp * self.spec.tp)
        world = torch.distributed.get_world_size()
        gathered = [None] * world if rank == 0 else None
        if self.spec.trains_adapters:
            mine = {}
            if self.dp_rank == 0:  # a TP group's adapters whole again (lora_A / lora_B shards)
                mine = {n: self._whole(p).detach().to("cpu", copy=True) for n, p in self.local if p.requires_grad}
            torch.distributed.gather_object(mine if self.tp_rank == 0 else {}, gathered, dst=0)
            if rank == 0:
                self.model.save_pretrained(str(out), state_dict={k: v for part in gathered for k, v in part.items()})
        else:
            shard = f"model-{stage + 1:05d}-of-{self.spec.pp:05d}.safetensors"
            sizes = {}
            if self.dp_rank == 0:
                from safetensors.torch import save_file

                lm = causal_lm(self.model)
                # a tied head's matrix is the first stage's embedding, written once (by that stage)
                again = lm.get_input_embeddings().weight if stage > 0 else None
                tensors = {
                    n: self._whole(t).detach().to("cpu").contiguous()
                    for n, t in lm.state_dict(keep_vars=True).items()
                    if not t.is_meta and t is not again
                }
                if self.tp_rank == 0:
                    save_file(tensors, str(out / shard), metadata={"format": "pt"})
                    sizes = {n: (shard, t.numel() * t.element_size()) for n, t in tensors.items()}
            torch.distributed.gather_object(sizes, gathered, dst=0)
            if rank == 0:
                import json

                where = {n: v for part in gathered for n, v in part.items()}
                index = {
                    "metadata": {"total_size": sum(size for _, size in where.values())},
                    "weight_map": {n: where[n][0] for n in sorted(where)},
                }
                (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
                lm = causal_lm(self.model)
                lm.config.save_pretrained(str(out))
                if lm.generation_config is not None:
                    lm.generation_config.save_pretrained(str(out))
        if rank == 0:
            tokenizer.save_pretrained(str(out))
        torch.distributed.barrier()

    def digest(self) -> str | None:
        """sha256 over the stages' digests in pipeline order (each over its parameters by name):
        the same on every rank, and equal between two runs of this layout exactly when every
        stage's weights are bitwise equal. Collective; None above export.DIGEST_MAX_PARAMS."""
        import torch

        if sum(p.numel() for p in self.model.parameters()) > export.DIGEST_MAX_PARAMS:
            return None
        h = hashlib.sha256()
        for name, p in self.local:
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
        ranks = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(ranks, h.hexdigest())
        # the shards of data-parallel rank 0, in (stage, TP rank) order
        shards = [d for r, d in enumerate(ranks) if r // self.spec.tp % self.dp == 0]
        return hashlib.sha256(" ".join(shards).encode()).hexdigest()

    def _whole(self, t):
        """A parameter whole again: its TP shards gathered from the group (collective over it)."""
        import torch

        dim = getattr(t, "tp_dim", None)
        if dim is None:
            return t
        grid = self.ds.module.mpu()
        parts = [torch.empty_like(t) for _ in range(self.spec.tp)]
        torch.distributed.all_gather(parts, t.detach().contiguous(), group=grid.get_slice_parallel_group())
        return torch.cat(parts, dim=dim)

def _mean(total, device, replicas: int) -> tuple[float, int]:
    """(sum / count, count / replicas) of a [loss sum, token count] summed over every rank."""
    import torch

    both = total.to(device)
    torch.distributed.all_reduce(both)
    loss_sum, count = (float(x) for x in both.cpu())
    return (loss_sum / count if count else float("nan")), round(count / replicas)


def build(model, params, spec: TrainSpec, ds_config: dict, optimizer_for, schedule, rank: int, world: int,
          blocks: list[int]):
    """The engine for this plan. `optimizer_for(params)` is the client optimizer over the
    parameters this rank trains (None: the config's AdamW); `schedule(optimizer)` the scheduler;
    `blocks` the plan's blocks per pipeline stage."""
    if spec.pp > 1:
        # the stage's trainable parameters are chosen after its layers are cut to this rank's TP shard
        return Pipeline(model, spec, ds_config, optimizer_for, schedule, rank, world, blocks)
    return DataParallel(model, params, spec, ds_config, optimizer_for, schedule, rank, world)
