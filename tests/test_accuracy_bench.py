"""bench/accuracy.py's bookkeeping: signed errors, the targets it checks and the notes it prints,
on real estimates of a published row (no trace: the traced path is tests/test_trace.py's)."""

from __future__ import annotations

import pytest

from bench.accuracy import evaluate, markdown, summarise, targets

pytest.importorskip("deepspeed")

ROW = {
    "id": "row-with-note",
    "trust": "A",
    "metric": "allocated",
    "measured": {"value": 60.0, "unit": "GiB"},
    "args": {
        "model": "llama-3.2-3b",
        "gpus": "1xA100-80GB",
        "method": "full",
        "precision": "bf16-pure",
        "micro_batch": 2,
        "seq_len": 4096,
        "grad_ckpt": "none",
    },
    "note": "the measured program expands GQA K/V",
}


def test_a_row_another_estimator_wins_fails_the_every_case_target_and_its_note_is_printed():
    result = evaluate(ROW, run_trace=False)
    errors = result["error_pct"]
    assert errors["analytic"] == pytest.approx(100 * (result["gib"]["analytic"] - 60.0) / 60.0, abs=0.01)
    checks = {t: (ok, ev) for t, ok, ev in targets([result], summarise([result]))}
    ok, evidence = checks["analytic closer than DeepSpeed, accelerate and llm-analysis in every case"]
    beaten = [
        n
        for n in ("deepspeed", "accelerate", "llm-analysis")
        if abs(errors.get(n, 1e9)) <= abs(errors["analytic"])
    ]
    assert ok == (not beaten)
    assert all(f"row-with-note ({n})" in evidence for n in beaten)
    text = markdown([result], summarise([result]), list(targets([result], summarise([result]))), 1.0)
    assert "- row-with-note: the measured program expands GQA K/V" in text


def test_rows_without_a_measurement_or_note_print_no_notes_section():
    row = {k: v for k, v in ROW.items() if k not in ("note", "measured")}
    result = evaluate(row, run_trace=False)
    assert "error_pct" not in result and "note" not in result
    assert "case files' notes" not in markdown([result], summarise([result]), [], 1.0)


OOM_ROW = {
    "id": "published-oom",
    "trust": "A",
    "metric": "allocated",
    "measured": {"oom": True},
    "args": {
        "model": "llama-2-7b",
        "gpus": "1xA100-80GB",
        "method": "full",
        "precision": "fp32",
        "seq_len": 512,
    },
}


def test_an_oom_row_is_never_traced_and_each_estimator_gets_a_verdict(monkeypatch):
    import launcher.trace as trace_module

    def no_trace(*a, **k):
        raise AssertionError("an OOM row has no figure to trace against")

    monkeypatch.setattr(trace_module, "trace", no_trace)
    result = evaluate(OOM_ROW, run_trace=True)
    assert result["oom"] and not result["fits"] and "error_pct" not in result
    assert result["predicts_oom"]["analytic"] is True
    assert "trace" not in result["gib"]
    checks = {t: (ok, ev) for t, ok, ev in targets([result], summarise([result]))}
    assert checks["every published OOM predicted as not fitting"] == (True, "1 of 1 OOM rows")
    row = next(
        line
        for line in markdown([result], summarise([result]), [], 1.0).splitlines()
        if "published-oom" in line
    )
    assert "| OOM |" in row and "(OOM)" in row


def test_an_oom_row_the_model_says_fits_fails_the_target():
    fits = {**OOM_ROW, "args": {**OOM_ROW["args"], "model": "llama-3.2-1b", "precision": "bf16"}}
    result = evaluate(fits, run_trace=False)
    assert result["fits"] and result["predicts_oom"]["analytic"] is False
    ok, evidence = next((ok, ev) for t, ok, ev in targets([result], summarise([result])) if "OOM" in t)
    assert not ok and evidence == "0 of 1 OOM rows"
    assert "fits: wrong" in markdown([result], summarise([result]), [], 1.0)
