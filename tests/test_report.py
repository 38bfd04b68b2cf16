"""`ftlaunch report RUN` (launcher/report.py): the page holds the loss and evaluation curves, tokens/s and
the plan's memory table beside the measured peaks; headless Chromium (Debian's package) renders it to a
non-blank screenshot with the charts and the table in its DOM; damaged metrics lines are skipped; a run
that does not exist is one line. A real run's report: tests/test_train_e2e.py (zero1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from launcher.cli import main

TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random"]


@pytest.fixture
def run_dir(tmp_path, capsys):
    assert main([*TINY, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path), "--max-steps", "20"]) == 0
    capsys.readouterr()
    run = tmp_path / "r"
    rows = [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3, "tokens_per_s": 1000.0 + 10 * s, "step_s": 0.5,
             "peak_allocated_gib": 0.5 + 0.01 * s, "peak_reserved_gib": 0.9, "host_rss_gib": 2.0} for s in range(1, 13)]
    lines = [json.dumps(r) for r in rows]
    lines[3:3] = ['{"step": 4, "loss": NaN', "\x00garbage", json.dumps([1, 2])]  # damaged: skipped
    lines += [json.dumps({"event": "eval", "step": s, "eval_loss": 5.5 - 0.05 * s, "eval_tokens": 99}) for s in (5, 10)]
    (run / "logs" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _report(run, capsys) -> dict:
    assert main(["report", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_page_has_the_curves_and_the_memory_table(run_dir, capsys):
    written = _report(run_dir, capsys)
    assert written["steps"] == 12 and written["html"] == str(run_dir / "report" / "report.html")
    page = (run_dir / "report" / "report.html").read_text()
    assert page.count("<polyline") == 2 and page.count("<circle") == 2  # 2 lines, 2 evaluations
    assert 'id="loss-chart"' in page and 'id="tokens-chart"' in page and "12 of 20 steps logged" in page
    plan = json.loads((run_dir / "plan.json").read_text())["plan"]["memory"]["per_gpu"]
    assert "<td>optimizer states</td>" in page and f"<td>peak allocated</td><td>{plan['peak_allocated_gib']:.3f}</td><td>0.620</td>" in page
    assert "src=" not in page and "<script" not in page and "href=" not in page  # nothing outside the page
    from PIL import Image

    assert [Image.open(p).size for p in written["png"]] == [(720, 300), (720, 300)]


def test_a_run_without_steps_and_a_missing_run(tmp_path, capsys):
    assert main([*TINY, "--dry-run", "--name", "new", "--runs-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert _report(tmp_path / "new", capsys)["steps"] == 0
    assert "No step logged yet" in (tmp_path / "new" / "report" / "report.html").read_text()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run directory" in err[0]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        why = "Debian's chromium is not installed: apt-get install chromium (tests/run.sh does as root)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def test_headless_chromium_renders_the_charts_and_the_table(run_dir, capsys, tmp_path):
    browser = chromium()
    _report(run_dir, capsys)
    url = (run_dir / "report" / "report.html").as_uri()
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=800,1200", url], capture_output=True, timeout=120, check=True)
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'id="loss-chart"' in dom and 'id="memory"' in dom and "<polyline" in dom
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20)
    assert image.size == (800, 1200) and len(colors) > 50  # text, grid, curves: not a blank page
    line = (0x1F, 0x77, 0xB4)  # the training loss's colour is on the screen
    assert any(c == line for _, c in colors)
