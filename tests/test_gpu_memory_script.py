"""bench/gpu_memory.py: the matrix, its order, skips and budget (no runs), the published-format
rows against bench/accuracy.py's loader, and the CPU path end to end (slow)."""

from __future__ import annotations

import json

import pytest

from bench import gpu_memory as gm
from bench import gpu_memory_matrix as gmm
from bench import gpu_memory_outputs as gmo
from bench.accuracy import evaluate, measured_gib

MODELS = ["qwen2.5-0.5b", "llama-3.1-8b"]


def test_matrix_passes_cover_every_model_before_the_variants():
    passes = gmm.matrix(MODELS, ["full", "lora"], ["none", "full"], [4096, 1024], [1])
    assert len(passes) == 2 * 2 * 2 * 2
    by_pass = {}
    for p, c in passes:
        by_pass.setdefault(p, set()).add((c.grad_ckpt, c.seq_len))
    # first ckpt mode at the shortest sequence, then the longest with the last ckpt mode, ...
    assert by_pass == {0: {("none", 1024)}, 1: {("full", 4096)}, 2: {("none", 4096)}, 3: {("full", 1024)}}
    assert {(c.model, c.method) for p, c in passes if p == 0} == {
        (m, x) for m in MODELS for x in ("full", "lora")
    }


def test_compiled_rows_carry_the_switch_to_the_estimate_the_worker_and_the_speed_model(tmp_path):
    """--compile: every row named -compiled, `ftlaunch estimate --compile` (the eager memory plan),
    the run directory's spec compiles, and the speed model re-predicts the row with its fused term."""
    from bench.gpu_memory_run import write_run
    from bench.speed_accuracy import configuration
    from launcher.rundir import read_run_dir

    (_, plain), (_, compiled) = (gmm.matrix(["llama-3.2-1b"], ["full"], ["none"], [1024], [1], compile=c)[0]
                                 for c in (False, True))
    assert compiled.name == plain.name + "-compiled" and compiled.args("1xH100")["compile"] is True
    assert "compile" not in plain.args("1xH100")
    est = {c: gm.estimate(c.args("1xH100")) for c in (plain, compiled)}
    assert "error" not in est[compiled] and est[compiled]["per_gpu"] == est[plain]["per_gpu"]
    assert gm.predicted_speed(compiled.args("1xH100")) > gm.predicted_speed(plain.args("1xH100"))
    assert configuration(compiled.args("1xH100"))[1].compile
    run_dir = write_run(tmp_path, compiled, "1xH100", tmp_path / "w", tmp_path / "d.jsonl", 3, est[compiled])
    assert read_run_dir(run_dir).spec["compile"] is True


def test_plan_rows_skips_what_cannot_run_and_orders_cheap_first():
    passes = gmm.matrix(MODELS, ["full", "lora", "qlora"], ["none"], [1024], [1])
    estimates = {c: gm.estimate(c.args("1xA100-80GB")) for _, c in passes}
    estimates[gmm.Config("qwen2.5-0.5b", "lora", "none", 1024, 1)] = {"error": "boom"}
    rows = gmm.plan_rows(passes, estimates, {"qlora": "bitsandbytes is not importable"})
    status = {(r["model"], r["method"]): r["status"] for r in rows}
    assert status[("llama-3.1-8b", "full")].startswith("skipped: estimate says it does not fit (")
    assert status[("qwen2.5-0.5b", "qlora")] == "skipped: bitsandbytes is not importable"
    assert status[("qwen2.5-0.5b", "lora")] == "skipped: estimate failed: boom"
    assert status[("qwen2.5-0.5b", "full")] is None and status[("llama-3.1-8b", "lora")] is None
    assert [r["model"] for r in rows] == ["qwen2.5-0.5b"] * 3 + ["llama-3.1-8b"] * 3  # small model first
    unfit = gmm.plan_rows(passes, estimates, {}, run_unfit=True)
    assert next(r for r in unfit if r["name"] == "llama-3.1-8b-full-ckpt-none-s1024-b1")["status"] is None


def test_budget_stops_rows_that_would_overrun_and_keeps_cheaper_ones():
    small, big = round(gmm.predicted_s(0, True)), round(gmm.predicted_s(10e9, True))
    rows = [
        {"name": "a", "model": "small", "params": 0, "status": None},
        {"name": "b", "model": "big", "params": 10e9, "status": None},
        {"name": "c", "model": "small", "params": 0, "status": "skipped: estimate says it does not fit"},
        {"name": "d", "model": "small", "params": 0, "status": None},
    ]
    now, ran = [0.0], []

    def run_one(row, left):
        ran.append((row["name"], left))
        now[0] += small
        return {"status": "ok"}

    gmm.run_rows(rows, run_one, budget_s=2 * small + 1, clock=lambda: now[0])
    assert [r["status"] for r in rows] == [
        "ok",
        f"not run: budget ({big} s predicted, {small + 1} s left)",
        "skipped: estimate says it does not fit",
        "ok",  # cheaper, and its model's weights are already written
    ]
    assert ran == [("a", 2 * small + 1), ("d", small + 1)]
    assert rows[3]["predicted_s"] == round(gmm.predicted_s(0, False)) and rows[3]["wall_s"] == small
    assert gmm.predicted_s(10e9, True) > gmm.predicted_s(10e9, False) > gmm.predicted_s(1e9, False)


def _measured_row():
    c = gmm.Config("llama-3.2-1b", "lora", "full", 4096, 1)
    args = c.args("1xH200")
    est = gm.estimate(args)["per_gpu"]
    row = {
        "name": c.name,
        "args": args,
        "status": "ok",
        "est_peak_allocated_gib": est["peak_allocated_gib"],
        "est_peak_reserved_gib": est["peak_reserved_gib"],
        "peak_allocated_gib": 8.5,
        "peak_reserved_gib": 9.75,
    }
    return row


META = {
    "device": "NVIDIA H200",
    "date": "2026-01-01",
    "torch": "2.11.0",
    "deepspeed": "0.19.8",
    "transformers": "5.17.0",
    "steps": 3,
    "gpus": "1xH200",
    "optimizer_impl": "DeepSpeed FusedAdam",
}


def test_published_rows_load_in_the_accuracy_bench():
    row = _measured_row()
    pub = gmo.published([row, {**row, "status": "skipped: x"}], META)
    assert [p["metric"] for p in pub] == ["allocated", "reserved"]
    for p in pub:
        assert set(p) == {"id", "trust", "metric", "measured", "args", "source"} and p["trust"] == "A"
        assert p["source"].startswith("bench/gpu_memory.py on NVIDIA H200, 2026-01-01")
    assert [measured_gib(p) for p in pub] == [8.5, 9.75]
    # the accuracy bench re-estimates from `args` alone and gets our estimate and our error back
    results = [evaluate(p, run_trace=False) for p in pub]
    assert [r["gib"]["analytic"] for r in results] == pytest.approx(
        [row["est_peak_allocated_gib"], row["est_peak_reserved_gib"]], abs=0.002
    )
    assert results[0]["error_pct"]["analytic"] == pytest.approx(
        gm.error_pct(row["est_peak_allocated_gib"], 8.5), abs=0.05
    )
    md = gmo.markdown(
        [
            {
                **row,
                "model": "llama-3.2-1b",
                "method": "lora",
                "grad_ckpt": "full",
                "seq_len": 4096,
                "micro_batch": 1,
                "error_allocated_pct": results[0]["error_pct"]["analytic"],
            }
        ],
        META,
    )
    assert "| llama-3.2-1b | lora | full | 4096 | 1 |" in md and "8.50" in md


def test_speed_rows_load_in_the_speed_bench():
    """A measured step's tokens/s goes out in published_speed.jsonl's shape; bench/speed_accuracy.py
    re-predicts it from `args` alone (the device's memory override included) and gets ours back."""
    from bench.speed_accuracy import evaluate as speed_evaluate

    row = _measured_row()
    row["args"] = {**row["args"], "gpu_memory": 139.8}
    row["est_tokens_per_s"] = gm.predicted_speed(row["args"])
    row.update(tokens_per_s=20000.0, error_speed_pct=gm.error_pct(row["est_tokens_per_s"], 20000.0))
    rows = gmo.speed_rows([row, {**row, "status": "failed: x"}, {**row, "error_speed_pct": None}], META)
    assert len(rows) == 1 and rows[0]["measured"] == {"tokens_per_s_per_gpu": 20000.0}
    r = speed_evaluate(rows[0])
    assert r["predicted"] == pytest.approx(row["est_tokens_per_s"], rel=1e-3) and r["gpu"] == "H200"
    assert r["error_pct"] == pytest.approx(row["error_speed_pct"], abs=0.05)
    shape = {
        "model": "llama-3.2-1b",
        "method": "lora",
        "grad_ckpt": "full",
        "seq_len": 4096,
        "micro_batch": 1,
    }
    assert "| 20,000 |" in gmo.markdown([{**row, **shape}], META)


def test_worker_peak_memory_record_on_the_cpu():
    pytest.importorskip("torch")
    from launcher.train.loop import _peak_memory

    rec = _peak_memory()
    assert rec["peak_allocated_gib"] is None and rec["peak_reserved_gib"] is None
    assert rec["host_rss_gib"] > 0 and rec["peak_mem_gib"] == rec["host_rss_gib"]  # older readers


@pytest.mark.slow
def test_cpu_path_end_to_end(tmp_path, capsys):
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    out = tmp_path / "rows.jsonl"
    code = gm.main(["--cpu", "--out", str(out), "--work-dir", str(tmp_path / "work"), "--keep", "--json"])
    assert code == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["method"] for r in rows] == ["lora", "full"]
    for r in rows:
        assert r["status"] == "ok", r["status"]
        assert r["model"] == "tiny-llama" and r["seq_len"] == 128 and r["device"].startswith("CPU")
        assert r["est_peak_allocated_gib"] > 0 and r["est_peak_reserved_gib"] > r["est_peak_allocated_gib"]
        assert r["peak_allocated_gib"] is None and r["peak_reserved_gib"] is None
        assert r["error_allocated_pct"] is None and r["host_rss_gib"] > 0
        # the CPU's tokens/s is measured but not compared with the nominal GPU's prediction
        assert r["tokens_per_s"] > 0 and r["est_tokens_per_s"] > 0 and r["error_speed_pct"] is None
        assert r["args"]["zero_stage"] == 0 and r["args"]["seq_len"] == 128
        # the worker logged every step with the new keys and the old one, and was killed after step 3
        log = tmp_path / "work" / "runs" / r["name"] / "logs" / "metrics.jsonl"
        steps = [json.loads(x) for x in log.read_text().splitlines() if '"step"' in x]
        assert [s["step"] for s in steps][:3] == [1, 2, 3]  # killed as it trained on
        assert all(
            s["peak_allocated_gib"] is None and s["host_rss_gib"] > 0 and "peak_mem_gib" in s for s in steps
        )
        assert not any((tmp_path / "work" / "runs" / r["name"] / "checkpoints").iterdir())
    meta = ("device", "torch", "date", "gpus")
    assert json.loads(capsys.readouterr().out) == [
        {k: v for k, v in r.items() if k not in meta} for r in rows
    ]
    assert (tmp_path / "rows.md").read_text().count("| tiny-llama |") == 2
    assert (tmp_path / "gpu_measured.cpu.jsonl").read_text() == ""  # no CUDA figures, nothing to publish
    assert (tmp_path / "gpu_speed.cpu.jsonl").read_text() == ""


def test_estimate_gpu_and_methods_follow_the_device():
    h200 = {"cuda": True, "device": "NVIDIA H200", "gpu_memory_gib": 139.8, "bitsandbytes": "0.45"}
    assert gm.gpu_for_estimate(h200, False, None) == ("1xH200", None)
    odd = {**h200, "device": "NVIDIA Mystery 9000", "gpu_memory_gib": 47.5}
    assert gm.gpu_for_estimate(odd, False, None) == ("1xH100-80GB", 47.5)  # nearest, memory overridden
    assert gm.gpu_for_estimate(h200, False, "A100-80GB") == ("1xA100-80GB", None)
    assert gm.unavailable_methods(h200, False) == {}
    assert "bitsandbytes" in gm.unavailable_methods({**h200, "bitsandbytes": None}, False)["qlora"]
    assert "NVIDIA GPU" in gm.unavailable_methods(h200, True)["qlora"]


def test_synthetic_data_fills_every_sample(tmp_path):
    pytest.importorskip("transformers")
    from bench.gpu_memory_run import write_data
    from launcher.train.data import read_records, tokenize
    from launcher.train.tokenizer import byte_tokenizer

    path = write_data(tmp_path / "data.jsonl", 4096)
    ex = tokenize(read_records(str(path)), byte_tokenizer(), 4096, "synthetic")
    assert len(ex.input_ids) == 8 and {len(x) for x in ex.input_ids} == {4096}
    assert all(lab != -100 for row in ex.labels for lab in row[1:])  # text records: every token trains
