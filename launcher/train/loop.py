"""The training loop every rank runs under DeepSpeed, driven only by the run directory.

Step N always trains on the same samples (data.Batches), checkpoints are atomic (checkpoint.py),
and a start resumes from the newest complete checkpoint with model, optimizer, scheduler, RNG
and data position, so no step is lost or repeated. SIGTERM / SIGUSR1 (preemption) make every
rank checkpoint at the next step boundary and exit with PREEMPTED.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

from launcher.rundir import read_run_dir
from launcher.spec import TrainSpec
from launcher.train import checkpoint as ckpt
from launcher.train import cpu_adam, deepspeed_import, engines, export, optimizers, token_cache
from launcher.train.data import Batches, eval_batches
from launcher.train.model import check_loadable, rank_model
from launcher.train.tokenizer import load_tokenizer

PREEMPTED = 75  # EX_TEMPFAIL: checkpointed, run again to resume


class _Stop:
    requested = False

    @classmethod
    def handler(cls, signum, frame):
        cls.requested = True


def _rng_state() -> dict:
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _restore_rng(state: dict | None) -> None:
    import torch

    if not state:
        return
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


_TRACKERS = None  # rank 0's --report-to trackers (launcher/train/tracking.py), once started


def _log(run_dir: Path, rank: int, record: dict) -> None:
    if rank != 0:
        return
    with open(run_dir / "logs" / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    if _TRACKERS is not None:
        _TRACKERS.record(record)
    parts = [
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items() if v is not None
    ]
    print("[ftlaunch] " + " | ".join(parts), flush=True)


def _peak_memory() -> dict:
    """This process's peaks so far (GiB): torch.cuda max allocated / max reserved (null on the CPU)
    and the host's max RSS. peak_mem_gib, kept for older readers, is max allocated on a GPU and
    the host RSS on the CPU."""
    import resource

    import torch

    rss = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)  # KiB -> GiB
    allocated = reserved = None
    if torch.cuda.is_available():
        allocated = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        reserved = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    return {
        "peak_mem_gib": rss if allocated is None else allocated,
        "peak_allocated_gib": allocated,
        "peak_reserved_gib": reserved,
        "host_rss_gib": rss,
    }


def _plan_lr(engine, lr: float) -> float | None:
    """After a resume: the checkpoint's optimizer and scheduler bring back the peak learning rate
    the run was saved with; a run planned again with another one (--replan --lr) trains with the
    plan's. Returns the saved one where it differed."""
    sched = engine.lr_scheduler
    saved = sched.base_lrs[0] if sched is not None and sched.base_lrs else None
    if saved is None or abs(saved - lr) <= 1e-12 * lr:
        return None
    sched.base_lrs = [lr for _ in sched.base_lrs]
    sched._last_lr = [lr * f(sched.last_epoch) for f in sched.lr_lambdas]  # what step() would set
    for group, value in zip(engine.optimizer.param_groups, sched._last_lr, strict=False):
        group["lr"] = value
        group["initial_lr"] = lr
    return saved


def _agreed_checkpoint(run_dir: Path, root: Path, rank: int) -> tuple[int, Path] | None:
    """The checkpoint every rank resumes from: rank 0 picks the newest that verifies and tells
    the others (collective). Ranks choosing on their own could disagree -- a shared filesystem's
    directory cache, or a save of the previous attempt still being renamed -- and would load
    different steps' partitions. A rank that cannot see rank 0's choice stops the start."""
    import torch

    found = None
    if rank == 0:
        found, skipped = ckpt.usable(root)
        for step, why in skipped:
            _log(run_dir, rank, {"event": "checkpoint_skipped", "step": step, "reason": why})
    choice = [found[0] if found else None]
    torch.distributed.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return None
    path = root / ckpt.tag_for(choice[0])
    if rank != 0 and not path.is_dir():
        raise ckpt.CheckpointError(
            f"rank {rank} does not see {path}, the checkpoint rank 0 resumes from: the run directory "
            "must be on storage every node shares, in sync (check the mount on this node)"
        )
    return choice[0], path


def train(run_dir: Path) -> int:
    import torch

    # from the start: a preemption during loading is honoured at the first step boundary
    signal.signal(signal.SIGTERM, _Stop.handler)
    signal.signal(signal.SIGUSR1, _Stop.handler)
    run = read_run_dir(run_dir)
    spec = TrainSpec(**run.spec)
    cfg = run.training
    ds_config = json.loads((run_dir / "ds_config.json").read_text())
    has_gpu = torch.cuda.is_available()
    check_loadable(spec, run.model.hf_config, run.model.source, cfg.init, has_gpu)
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    pids = run_dir / "logs" / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / f"rank-{rank}").write_text(f"{os.getpid()}\n")
    if has_gpu:
        torch.cuda.set_device(local_rank)
    from launcher.train.distributed import init as init_distributed

    init_distributed("nccl" if has_gpu else "gloo")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = world // (spec.tp * spec.pp)
    random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed)

    tokenizer = load_tokenizer(cfg.tokenizer, run.model.source, run.model.hf_config.get("vocab_size", 0))
    examples, held_out, built = token_cache.on_ranks(run_dir, cfg, tokenizer, spec.seq_len, local_rank)
    _log(run_dir, rank, {"event": "tokens", "built": built, "records": len(examples.input_ids),
                         "eval_records": len(held_out.input_ids) if held_out is not None else 0})
    if examples.skipped or examples.no_target:
        _log(run_dir, rank, {"event": "data", "records": len(examples.input_ids), "skipped": examples.skipped,
                             "no_target": examples.no_target})
    if spec.packing:
        from launcher.train.packing import packed

        examples, packing = packed(examples, spec.seq_len)
        _log(run_dir, rank, {"event": "packing", **packing})
    batches = Batches(examples, spec.micro_batch, spec.grad_accum, dp, cfg.seed, tokenizer.pad_token_id)
    if rank == 0 and cfg.report_to:
        global _TRACKERS
        from launcher.train.tracking import Trackers

        _TRACKERS = Trackers(run_dir, cfg.report_to, run_dir.name, {**run.spec, "world": world, "dp": dp})

    # hf_ds keeps zero.Init on for the whole run under ZeRO-3 (transformers holds it by weak reference)
    model, blocks, hf_ds = rank_model(run, spec, ds_config, rank, world, local_rank if has_gpu else None)
    if spec.method == "qlora":
        from launcher.train.quantize import quantized_layers

        _log(run_dir, rank, {"event": "quantized", "format": spec.quant, "layers": quantized_layers(model)})
    if spec.loss == "chunked":
        from launcher.memory.constants import LOSS_CHUNK_TOKENS

        chunks = -(-spec.micro_batch * spec.seq_len // LOSS_CHUNK_TOKENS)
        _log(run_dir, rank, {"event": "chunked_loss", "chunk_tokens": LOSS_CHUNK_TOKENS, "chunks": chunks})
    if spec.compile:
        compiled = sum(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
        _log(run_dir, rank, {"event": "compiled", "blocks": compiled})
    params = [p for p in model.parameters() if p.requires_grad]
    warmup = cfg.warmup_steps

    def schedule(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    root = run_dir / "checkpoints"
    layout = {"world": world, "tp": spec.tp, "pp": spec.pp, "zero_stage": spec.zero_stage,
              "optimizer_step": spec.optimizer_step}
    found = _agreed_checkpoint(run_dir, root, rank)
    load_root = root
    saved = ckpt.saved_layout(found[1]) if found else None
    was_step = (saved or {}).get("optimizer_step", "after-backward")
    if saved and was_step != spec.optimizer_step:
        raise ckpt.CheckpointError(
            f"{found[1].name} was written with --optimizer-step {was_step}, whose optimizer state has another form "
            f"than {spec.optimizer_step}'s; plan again with --optimizer-step {was_step}"
        )
    if saved and spec.optimizer_step == "in-backward" and saved["world"] != world:
        # ZeRO-0: every rank holds the whole model and optimizer state, so any GPU count loads it
        _log(run_dir, rank, {"event": "resized", "from_world": saved["world"], "to_world": world})
    elif saved and (saved["world"], saved["tp"], saved.get("pp", 1)) != (world, spec.tp, spec.pp):
        if spec.pp > 1 or saved.get("pp", 1) > 1:
            # the pipeline engine saves each (stage, TP rank) as its own layer files, which
            # DeepSpeed's universal-checkpoint converter does not regroup into other stages
            raise ckpt.CheckpointError(
                f"{found[1].name} was written by {saved['world']} ranks at tp {saved['tp']} x pp "
                f"{saved.get('pp', 1)}; this launch has {world} at tp {spec.tp} x pp {spec.pp}, and a pipeline "
                "checkpoint resumes only on the layout that wrote it; plan again with that GPU count, --tp and "
                "--pp (or start a new run from its exported model)"
            )
        # planned again for another GPU count: resume through DeepSpeed's universal checkpoint
        load_root = ckpt.to_universal(found[1], rank, torch.distributed.barrier)
        ds_config.setdefault("checkpoint", {})["load_universal"] = True
        _log(run_dir, rank, {"event": "universal", "from_world": saved["world"], "to_world": world})
    def optimizer_for(trained):
        from launcher.models.hf_config import arch_from_hf_config

        hidden = arch_from_hf_config(run.model.hf_config, "model").hidden
        return optimizers.client_optimizer(spec, trained, cfg.lr, cfg.weight_decay, hidden)

    trainer = engines.build(model, params, spec, ds_config, optimizer_for, schedule, rank, world, blocks)
    engine = trainer.ds
    if spec.tp > 1:  # what AutoTP left on this rank: the memory model's count of one TP rank's weights
        held = sum(p.numel() for p in engine.module.parameters())
        _log(run_dir, rank, {"event": "tensor_parallel", "tp": spec.tp, "parameters": held})
    if spec.optimizer_step == "in-backward":
        _log(run_dir, rank, {"event": "optimizer_in_backward", "parameters": len(params), "gradient_clipping": 0.0})
    device = engine.device

    if rank == 0:
        ckpt.clean_partial(root)
    engine.barrier() if hasattr(engine, "barrier") else torch.distributed.barrier()
    start = 0
    if found:
        step, path = found
        engine.load_checkpoint(str(load_root), tag=path.name, load_module_strict=False)
        cpu_adam.replay_bias_correction(engine.optimizer)  # else the next update is off by an ulp
        _restore_rng(ckpt.load_rank_state(path))
        start = step
        _log(run_dir, rank, {"event": "resumed", "step": step})
        was = _plan_lr(engine, cfg.lr)
        if was is not None:
            _log(run_dir, rank, {"event": "lr_changed", "step": step, "from": was, "to": cfg.lr})

    def barrier():
        torch.distributed.barrier()

    def save(step: int) -> None:
        try:
            ckpt.save(engine, root, step, {"step": step}, _rng_state(), cfg.keep_last, barrier, layout)
        except Exception as exc:  # noqa: BLE001 - torch reports a full disk as RuntimeError
            raise ckpt.failure(root, step, exc) from None
        _log(run_dir, rank, {"event": "checkpoint", "step": step})

    held = None if held_out is None else eval_batches(held_out, spec.micro_batch, dp, trainer.dp_rank, tokenizer.pad_token_id)

    def evaluate(step: int) -> None:
        loss, tokens = trainer.eval_loss(held)
        _log(run_dir, rank, {"event": "eval", "step": step, "eval_loss": loss, "eval_tokens": tokens})

    for step in range(start, cfg.max_steps):
        t0 = time.perf_counter()
        loss, tokens = trainer.step(batches, step)
        stop = torch.tensor([1.0 if _Stop.requested else 0.0], device=device)
        torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
        elapsed = time.perf_counter() - t0
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.max_steps:
            _log(
                run_dir,
                rank,
                {
                    "step": step + 1,
                    "loss": loss,  # full precision: resume is compared bitwise
                    "lr": engine.get_lr()[0],
                    "tokens_per_s": round(tokens * dp / elapsed, 1),
                    "step_s": round(elapsed, 3),  # the ETA of `ftlaunch status` and a followed log
                    **_peak_memory(),
                },
            )
        done = step + 1 == cfg.max_steps
        if held and not stop.item() and (done or cfg.eval_every and (step + 1) % cfg.eval_every == 0):
            evaluate(step + 1)
        if (step + 1) % cfg.save_every == 0 or done or stop.item():
            save(step + 1)
        if stop.item() and not done:
            _log(run_dir, rank, {"event": "preempted", "step": step + 1})
            _close(torch, finished=False)
            return PREEMPTED

    digest = trainer.digest()
    if digest:
        (run_dir / "logs" / f"weights-rank-{rank}.sha256").write_text(digest + "\n")
    eval_loss = trainer.evaluate(batches)
    trainer.export(tokenizer, run_dir / "output" / "final", rank, cfg.max_shard_size)
    if cfg.merge_adapter and rank == 0:
        export.merge_adapter(run.model.hf_config, run.model.source, spec, cfg, tokenizer, run_dir / "output")
    if rank == 0:
        final = {"steps": cfg.max_steps, "eval_loss": eval_loss}
        best = _best_eval(run_dir)
        if best:  # over every attempt's evaluations (a resumed run logged the earlier ones)
            final["best_eval"] = best
            _log(run_dir, rank, {"event": "best_eval", **best})
        (run_dir / "output" / "final.json").write_text(json.dumps(final))
    _log(run_dir, rank, {"event": "finished", "eval_loss": round(eval_loss, 6)})
    _close(torch, finished=True)
    return 0


def _best_eval(run_dir: Path) -> dict | None:
    """The step with the lowest evaluation loss so far (the earliest of equals), from metrics.jsonl."""
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in rows if r.get("event") == "eval"]
    if not evals:
        return None
    best = min(evals, key=lambda r: (r["eval_loss"], r["step"]))
    return {"step": best["step"], "eval_loss": best["eval_loss"]}


def _close(torch, finished: bool) -> None:
    """The trackers closed; every rank at the same point, then the process group torn down while
    the interpreter is whole (not by its exit-time destructors)."""
    if _TRACKERS is not None:
        _TRACKERS.close(finished)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    import warnings

    from launcher.errors import FtlaunchError

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch/DeepSpeed deprecation noise per step
    deepspeed_import.load()  # before any other import of it (3-4 s less per rank where mlflow is installed)
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m launcher.train RUN_DIR\n")
        return 2
    try:
        return train(Path(argv[0]))
    except FtlaunchError as exc:
        sys.stderr.write(f"ftlaunch worker: error: {exc}\n")
        return 2


def exit_process(code: int) -> None:
    """End a rank's process without the interpreter's teardown. Seen once in ~15 CPU runs of pp 2
    with the optimizer offloaded (tests/test_resume_exact.py): a rank that had finished, exported
    and logged `finished` died in teardown with "terminate called without an active exception"
    (a C++ thread destroyed unjoined), exit -6, and the launcher would report a finished job
    FAILED. The process group is destroyed at the end of train(); everything the run keeps is
    written and closed by then, so only the output streams need flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
