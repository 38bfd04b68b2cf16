"""Real fine-tunes on the CPU: run directories written by the emitters, trained by the worker
under torchrun with 2 ranks and DeepSpeed's CPU accelerator (gloo)."""

from __future__ import annotations

import json
import os

import pytest

from launcher.models.catalog import resolve_model
from launcher.spec import TrainSpec
from tests.runs import events, in_memory_sets, make_run, run_torchrun

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow

CASES = {
    "zero1": TrainSpec(zero_stage=1, micro_batch=2, seq_len=64),
    # packed conversations: position ids through DeepSpeed's engine and the export's evaluation
    # (at 256 tokens the demo conversations make 50 rows of 101 samples)
    "zero2": TrainSpec(zero_stage=2, micro_batch=2, seq_len=256, grad_accum=2, packing=True),
    "zero3": TrainSpec(zero_stage=3, micro_batch=2, seq_len=64),
    "autotp": TrainSpec(zero_stage=1, tp=2, micro_batch=2, seq_len=64),
    "lora-zero3": TrainSpec(
        method="lora", lora_r=8, zero_stage=3, micro_batch=2, seq_len=64, grad_ckpt="full"
    ),
    # QLoRA through bitsandbytes' CPU backend: 4-bit NF4 without ZeRO, LLM.int8() with the
    # quantised weights sharded by ZeRO-3 (stored in bf16, so ZeRO partitions them like any other)
    "qlora-nf4-zero0": TrainSpec(method="qlora", lora_r=8, zero_stage=0, micro_batch=2, seq_len=64),
    "qlora-int8-zero0": TrainSpec(method="qlora", quant="int8", lora_r=8, zero_stage=0, micro_batch=2, seq_len=64),
    "qlora-int8-zero3": TrainSpec(
        method="qlora", quant="int8", lora_r=8, zero_stage=3, micro_batch=2, seq_len=64, grad_ckpt="full"
    ),
    "adamw8bit-zero1": TrainSpec(zero_stage=1, micro_batch=2, seq_len=64, optimizer="adamw-8bit"),
    # bitsandbytes' paged 8-bit AdamW (ordinary states on a CPU rank; the same optimizer code)
    "paged-adamw8bit-lora-zero1": TrainSpec(
        method="lora", lora_r=8, optimizer="paged-adamw-8bit", zero_stage=1, micro_batch=2, seq_len=64
    ),
    # the PEFT + bitsandbytes recipe's precision: bf16 base, fp32 adapters and states, torch_autocast
    "lora-autocast-zero3": TrainSpec(
        method="lora", lora_r=8, precision="bf16-autocast", zero_stage=3, micro_batch=2, seq_len=64
    ),
    "qlora-autocast-zero0": TrainSpec(method="qlora", lora_r=8, precision="bf16-autocast", micro_batch=2, seq_len=64),
    # PEFT's adapters on the embedding and the LM head too (issue 20), gradients sharded by ZeRO-2
    "lora-edges-zero2": TrainSpec(
        method="lora", lora_r=8, lora_targets="q_proj,v_proj,embed_tokens,lm_head", zero_stage=2, micro_batch=2,
        seq_len=64,
    ),
    # the seed scenario's shape (bloom-176b on 8xA100): optimizer states on NVMe, weights in RAM
    "zero3-nvme": TrainSpec(
        zero_stage=3, offload_optimizer="nvme", offload_params="cpu", micro_batch=2, seq_len=64
    ),
}


SMALL_SHARDS = "100KB"
# cases that train on the shipped conversation set (chat template, assistant turns only)
DATA = {"zero2": "demo-chat"}
# cases that hold out records and evaluate them (--eval-split, --eval-every)
HELD_OUT = {"zero1": {"eval_split": 0.1, "eval_every": 4}, "zero3": {"eval_split": 0.1}}
# cases that also report to every tracker (--report-to), read back with each library's reader
TRACKED = {"zero1": ["tensorboard", "wandb", "mlflow"]}


def needs_async_io(spec: TrainSpec) -> None:
    """NVMe offload needs DeepSpeed's async I/O op (libaio): tests/run.sh installs it as root.
    Without it the case cannot run; in CI that is a failure, elsewhere a skip that says why."""
    if "nvme" not in (spec.offload_optimizer, spec.offload_params):
        return
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        why = "DeepSpeed's async I/O op cannot be built here: apt-get install libaio-dev"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def metrics(run_dir):
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def fixed_batch(run_dir=None):
    """The batch the worker evaluates at the end: its training set's first micro-batch (the run's
    data, less its held-out records; the demo set without a run)."""
    from launcher.rundir import TrainingConfig, read_run_dir
    from launcher.train.data import Batches
    from launcher.train.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    spec = read_run_dir(run_dir).spec if run_dir else {}
    seq_len = spec.get("seq_len", 64)
    ex, _ = in_memory_sets(read_run_dir(run_dir).training if run_dir else TrainingConfig(), tok, seq_len)
    if spec.get("packing"):
        from launcher.train.packing import packed

        ex = packed(ex, seq_len)[0]
    return Batches(ex, 2, 1, 2, 0, tok.pad_token_id).get(0, 0, 0)[0]


def reload_loss(run_dir, spec: TrainSpec, quantized_base: bool = True, source: str | None = None) -> float:
    """The fixed batch's loss of the exported model, reloaded as a user would: the full model with
    transformers; an adapter with peft on the same base (the random init, or the checkpoint at
    `source`), quantised as trained under QLoRA unless `quantized_base` is False (the 16-bit base a
    QLoRA adapter is usually merged into)."""
    final = run_dir / "output" / "final"
    if spec.trains_adapters:
        import peft

        from launcher.train.model import build_model
        from launcher.train.quantize import quantize_linears

        arch = resolve_model("tiny-llama")
        base_spec = spec.base_model(grad_ckpt="none", zero_stage=0)
        if source is None:
            base = build_model(arch.hf_config, "tiny-llama", base_spec, "random", 0, 0.0)
        else:
            base = build_model(arch.hf_config, source, base_spec, "pretrained", 0, 0.0)
        if spec.method == "qlora" and quantized_base:
            quantize_linears(base, spec.quant, torch.bfloat16, keep={id(base.get_output_embeddings())})
        model = peft.PeftModel.from_pretrained(base, str(final))
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.bfloat16)
    model.eval()
    with torch.no_grad():
        return float(model(**fixed_batch(run_dir)).loss.float())


def check_tracking(run_dir) -> None:
    """The losses of metrics.jsonl, as TensorBoard's and MLflow's own readers read them back from what the
    run wrote; the W&B offline run (in the run directory, under the id kept for a relaunch) holds the keys."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the file store, as writing it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    want = {r["step"]: r["loss"] for r in metrics(run_dir)}
    evals = {e["step"]: e["eval_loss"] for e in events(run_dir) if e["event"] == "eval"}
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    got = {e.step: e.value for e in board.Scalars("train/loss")}
    assert got == pytest.approx(want, rel=1e-6)  # stored as float32
    assert {e.step: e.value for e in board.Scalars("eval/loss")} == pytest.approx(evals, rel=1e-6)
    ids = json.loads((run_dir / "logs" / "tracking.json").read_text())
    client = MlflowClient(tracking_uri=ids["mlflow"]["uri"])
    history = client.get_metric_history(ids["mlflow"]["run_id"], "train/loss")
    assert {m.step: m.value for m in history} == pytest.approx(want, rel=1e-12)
    run = client.get_run(ids["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["zero_stage"] == "1"
    assert ids["mlflow"]["uri"].startswith((run_dir / "mlruns").resolve().as_uri())
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']}")
    logged = (offline / f"run-{ids['wandb']}.wandb").read_bytes()
    assert logged.count(b"train/loss") >= len(want) and b"eval/loss" in logged and b"tokens_per_s" in logged


def check_evaluations(run_dir, held: dict) -> None:
    """Evaluations at every eval_every step and the end; the last one is the exported model's loss
    per labelled token over the held-out records, computed here apart; the best step is recorded."""
    from launcher.rundir import read_run_dir
    from launcher.train.data import collate, labelled
    from launcher.train.tokenizer import byte_tokenizer

    evals = [e for e in events(run_dir) if e["event"] == "eval"]
    every = held.get("eval_every") or 8
    assert [e["step"] for e in evals] == list(range(every, 9, every))
    tok = byte_tokenizer()
    _, ex = in_memory_sets(read_run_dir(run_dir).training, tok, 64)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(run_dir / "output" / "final"), dtype=torch.bfloat16)
    total = count = 0
    with torch.no_grad():
        for i in range(len(ex.input_ids)):
            batch = collate(ex, [i], tok.pad_token_id)
            n = labelled(batch["labels"])
            total, count = total + float(model.eval()(**batch).loss.float()) * n, count + n
    assert evals[-1]["eval_tokens"] == count
    assert evals[-1]["eval_loss"] == pytest.approx(total / count, rel=2e-3)
    best = min(evals, key=lambda e: e["eval_loss"])
    final = json.loads((run_dir / "output" / "final.json").read_text())
    assert final["best_eval"] == {"step": best["step"], "eval_loss": best["eval_loss"]}


@pytest.mark.parametrize("name", list(CASES))
def test_trains_and_final_weights_reload(name, tmp_path):
    spec = CASES[name]
    needs_async_io(spec)
    lr = 5e-3 if spec.trains_adapters else 1e-3
    nvme = str(tmp_path / "nvme")
    # ZeRO-3's gathered export in small safetensors shards (tiny-llama is ~0.4 MB in bf16)
    shard = SMALL_SHARDS if name == "zero3" else "5GB"
    run_dir, argv = make_run(
        tmp_path, name, spec, max_steps=8, save_every=4, lr=lr, nvme_path=nvme, max_shard_size=shard,
        data=DATA.get(name), report_to=TRACKED.get(name, []), **HELD_OUT.get(name, {}),
    )
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final_dir = run_dir / "output" / "final"
    if spec.trains_adapters:
        assert (final_dir / "adapter_model.safetensors").is_file()
        if spec.precision == "bf16-autocast":  # trained (and saved) in fp32 beside the bf16 base
            from safetensors import safe_open

            with safe_open(str(final_dir / "adapter_model.safetensors"), "pt") as f:
                assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
        if "lm_head" in spec.lora_targets:
            from safetensors import safe_open

            with safe_open(str(final_dir / "adapter_model.safetensors"), "pt") as f:
                names = set(f.keys())
            assert any("embed_tokens.lora_embedding_A" in n for n in names), sorted(names)
            assert any("lm_head.lora_B" in n for n in names), sorted(names)
    elif shard == SMALL_SHARDS:
        index = json.loads((final_dir / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1  # reloaded below, shard by shard
    else:
        assert (final_dir / "model.safetensors").is_file()
    losses = [r["loss"] for r in metrics(run_dir)]
    assert len(losses) == 8
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    final = json.loads((run_dir / "output" / "final.json").read_text())
    assert reload_loss(run_dir, spec) == pytest.approx(final["eval_loss"], rel=1e-3, abs=1e-3)
    if spec.packing:  # the rows the worker trained on, as packing.packed makes them from the samples
        (info,) = [e for e in events(run_dir) if e["event"] == "packing"]
        assert {k: info[k] for k in ("samples", "rows", "fill")} == {"samples": 101, "rows": 50, "fill": 0.9516}
        assert "position_ids" in fixed_batch(run_dir)
    if name in HELD_OUT:
        check_evaluations(run_dir, HELD_OUT[name])
    if name in TRACKED:
        check_tracking(run_dir)
        from launcher import report  # the page of a real run: its 8 steps, its evaluations

        assert report.write(run_dir)["steps"] == 8
        assert (run_dir / "report" / "report.html").read_text().count("<circle") == len(
            [e for e in events(run_dir) if e["event"] == "eval"]
        )
    if spec.tp > 1:  # AutoTP's split (block linears and the untied LM head) is what the model counts
        from launcher.memory.states import stage_params

        arch = resolve_model("tiny-llama")
        held = next(e for e in events(run_dir) if e["event"] == "tensor_parallel")["parameters"]
        assert held == stage_params(arch, spec, arch.layers, True, True).total
    if spec.method == "qlora":
        # every block linear trained quantised (tiny-llama: 2 blocks x 7), the head not
        assert {"event": "quantized", "format": spec.quant, "layers": 14} in events(run_dir)
        # the adapter also serves the 16-bit base it is usually merged into, off by the base's
        # quantisation error alone (measured 1.1e-3 relative; the untrained base is ~5 % off)
        assert reload_loss(run_dir, spec, quantized_base=False) == pytest.approx(final["eval_loss"], rel=5e-3)
    # checkpoints: the last two complete ones kept, no partial save left behind
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step-00000004", "step-00000008"]


def test_merge_adapter_writes_a_full_model_with_the_adapters_loss(tmp_path):
    """--merge-adapter: the QLoRA adapter merged into the 16-bit base (as QLoRA recipes merge it),
    one full model that transformers loads alone and that gives the adapter's loss on that base."""
    spec = TrainSpec(method="qlora", lora_r=8, zero_stage=1, micro_batch=2, seq_len=64)
    run_dir, argv = make_run(tmp_path, "merge", spec, max_steps=4, save_every=4, lr=5e-3, merge_adapter=True)
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    merged = run_dir / "output" / "final-merged"
    assert (merged / "model.safetensors").is_file() and (merged / "tokenizer.json").is_file()
    assert not list(merged.glob("adapter*"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        loss = float(model(**fixed_batch()).loss.float())
    # bf16 rounding of W + BA against the adapter applied beside W: measured well under 1e-3
    assert loss == pytest.approx(reload_loss(run_dir, spec, quantized_base=False), rel=1e-3)
    from launcher.train.model import build_model

    arch = resolve_model("tiny-llama")
    base = build_model(arch.hf_config, "tiny-llama", spec.base_model(), "random", 0, 0.0).eval()
    with torch.no_grad():
        assert abs(float(base(**fixed_batch()).loss.float()) - loss) > 1e-2  # the adapter is in it


def test_qlora_under_zero3_quantises_a_pretrained_checkpoint_while_loading(tmp_path):
    """The path GPU users take with real weights: ZeRO-3 with transformers' bitsandbytes quantiser
    inside from_pretrained (under zero.Init), not the worker's in-place quantisation."""
    from launcher.models.catalog import CATALOG
    from launcher.train.model import build_model

    ckpt = tmp_path / "pretrained"
    build_model(dict(CATALOG["tiny-llama"]), "", TrainSpec(), "random", 11, 0.0).save_pretrained(str(ckpt))
    spec = TrainSpec(method="qlora", lora_r=8, zero_stage=3, micro_batch=2, seq_len=64)
    run_dir, argv = make_run(
        tmp_path, "qz3", spec, model=str(ckpt), init="pretrained", max_steps=6, save_every=3, lr=5e-3
    )
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {"event": "quantized", "format": "nf4", "layers": 14} in events(run_dir)
    losses = [r["loss"] for r in metrics(run_dir)]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    assert (run_dir / "output" / "final" / "adapter_model.safetensors").is_file()
    final = json.loads((run_dir / "output" / "final.json").read_text())
    assert reload_loss(run_dir, spec, source=str(ckpt)) == pytest.approx(final["eval_loss"], rel=1e-3, abs=1e-3)


def test_chunked_loss_trains_the_curve_of_the_whole_loss(tmp_path):
    """--loss chunked under ZeRO-3 (the head's weight gathered for every chunk and its recompute,
    its gradient summed over the chunks before ZeRO reduces it): 4 x 512 tokens per micro-batch
    are two chunks, and the loss curve is the whole loss's (fp32, so only summation order differs)."""
    curves = {}
    for loss in ("full", "chunked"):
        spec = TrainSpec(zero_stage=3, precision="fp32", micro_batch=4, seq_len=512, loss=loss)
        run_dir, argv = make_run(tmp_path / loss, loss, spec, max_steps=3, save_every=3, lr=1e-3)
        proc = run_torchrun(argv)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        curves[loss] = [r["loss"] for r in metrics(run_dir)]
        chunked = [e for e in events(run_dir) if e["event"] == "chunked_loss"]
        assert chunked == ([{"event": "chunked_loss", "chunk_tokens": 1024, "chunks": 2}] if loss == "chunked" else [])
    assert len(curves["chunked"]) == 3 and curves["chunked"][-1] < curves["chunked"][0], curves
    assert curves["chunked"] == pytest.approx(curves["full"], rel=1e-5), curves


def test_optimizer_in_backward_trains_the_curve_of_the_step_after_backward(tmp_path):
    """--optimizer-step in-backward on 2 ranks (fp32, ZeRO-0): every parameter stepped from its
    gradient hook, gradients averaged as they come (tiny-llama's 64² bucket holds a few), against
    DeepSpeed's usual step with the same AdamW and no clipping (in-backward cannot clip: its DeepSpeed
    config says 0, and the baseline's is set to 0 to compare): the same curve to float tolerance."""
    curves = {}
    for step in ("after-backward", "in-backward"):
        spec = TrainSpec(precision="fp32", micro_batch=2, seq_len=128, optimizer_step=step)
        run_dir, argv = make_run(tmp_path / step, step, spec, max_steps=4, save_every=4, lr=1e-3)
        config = json.loads((run_dir / "ds_config.json").read_text())
        if step == "after-backward":
            config["gradient_clipping"] = 0.0
            (run_dir / "ds_config.json").write_text(json.dumps(config))
        else:
            assert config["gradient_clipping"] == 0.0 and "optimizer" not in config
        proc = run_torchrun(argv)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        curves[step] = [r["loss"] for r in metrics(run_dir)]
        logged = [e for e in events(run_dir) if e["event"] == "optimizer_in_backward"]
        assert len(logged) == (step == "in-backward")
    assert len(curves["in-backward"]) == 4 and curves["in-backward"][-1] < curves["in-backward"][0], curves
    assert curves["in-backward"] == pytest.approx(curves["after-backward"], rel=1e-4), curves


def test_zero3_hpz_trains_the_curve_of_plain_zero3(tmp_path):
    """ZeRO++ hpZ (--hpz 2) on 4 ranks, in groups of 2: the backward gathers each weight from the
    secondary shards of its group's 2 ranks, which hold the same values, so the loss curve is plain
    ZeRO-3's bit for bit; the emitted config is what turns it on."""
    curves = {}
    for hpz in (1, 2):
        spec = TrainSpec(zero_stage=3, micro_batch=2, seq_len=64, hpz=hpz)
        run_dir, argv = make_run(tmp_path / f"hpz{hpz}", f"hpz{hpz}", spec, gpus="1x4xA100", max_steps=2, save_every=2, lr=1e-3)
        config = json.loads((run_dir / "ds_config.json").read_text())
        assert config["zero_optimization"].get("zero_hpz_partition_size", 1) == hpz
        proc = run_torchrun(argv)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        curves[hpz] = [r["loss"] for r in metrics(run_dir)]
    assert len(curves[2]) == 2 and curves[2][-1] < curves[2][0], curves
    assert curves[2] == curves[1], curves
