"""Progress: `ftlaunch status`'s step N of M, loss and ETA from metrics.jsonl (whatever the file
holds), and a followed log's step lines turned into one progress line on a terminal only."""

from __future__ import annotations

import io
import json

from hypothesis import given
from hypothesis import strategies as st

from launcher import progress

# the worker's step lines as they reach launcher.log (launcher/train/loop.py's _log)
LOG = (
    "W1207 torchrun noise\n"
    "[ftlaunch] step 1 | loss 5.544 | lr 0.001 | tokens_per_s 812.3 | step_s 0.5 | peak_gib 0.01\n"
    "[ftlaunch] step 2 | loss 5.31 | lr 0.001 | tokens_per_s 1020 | step_s 0.25 | peak_gib 0.01\n"
    "[ftlaunch] event checkpoint | step 2\n"
    "[ftlaunch] step 3 | loss 5.12 | lr 0.001 | tokens_per_s 1000 | step_s 0.25 | peak_gib 0.01\n"
)


def run_dir(tmp_path, rows, max_steps=10):
    (tmp_path / "logs").mkdir()
    (tmp_path / "plan.json").write_text(json.dumps({"training": {"max_steps": max_steps}}))
    (tmp_path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_summary_gives_the_last_loss_and_the_time_left_at_the_recent_step_time(tmp_path):
    rows = [{"step": s, "loss": 5.0 - s / 10, "step_s": t} for s, t in ((1, 9.0), (2, 2.0), (3, 2.0))]
    rows.insert(2, {"event": "checkpoint", "step": 2})
    got = progress.summary(run_dir(tmp_path, rows))
    assert got == {"max_steps": 10, "loss": 4.7, "eta_s": 7 * 2.0}  # the median ignores the slow first step
    assert progress.clock(14.0) == "0m14s" and progress.clock(3 * 3600 + 125) == "3h02m"


@given(st.binary(max_size=2000))
def test_summary_of_any_metrics_file_is_an_answer_not_an_exception(tmp_path_factory, blob):
    d = tmp_path_factory.mktemp("m")
    (d / "logs").mkdir()
    (d / "logs" / "metrics.jsonl").write_bytes(blob + b'\n{"step": 1, "loss": 1e999}\n{"step": true, "loss": 2}\n')
    (d / "plan.json").write_bytes(blob)
    got = progress.summary(d)
    assert set(got) <= {"max_steps", "loss", "eta_s"}


def follow(text_chunks, tty):
    out = io.StringIO()
    f = progress.Follower(out, 10, tty)
    for chunk in text_chunks:
        f(chunk)
    f.close()
    return out.getvalue()


def test_on_a_terminal_the_step_lines_are_one_line_rewritten_in_place():
    chunks = [LOG[i : i + 37] for i in range(0, len(LOG), 37)]  # lines arrive cut anywhere
    got = follow(chunks, tty=True)
    assert got.count("\n") == 3  # the noise line, the checkpoint event, the progress line's end
    assert "W1207 torchrun noise\n" in got and "[ftlaunch] event checkpoint | step 2\n" in got
    last = got.split("\r\x1b[K")[-1]
    # step 3 of 10, 7 steps left at the median of 0.5, 0.25, 0.25 s
    assert last == "[ftlaunch] step 3/10  loss 5.12  1,000 tokens/s  ETA 0m02s\n"
    # an event line is printed above the progress line, which is drawn again below it
    assert "\r\x1b[K[ftlaunch] event checkpoint | step 2\n[ftlaunch] step 2/10" in got


def test_not_on_a_terminal_the_log_passes_through_unchanged():
    chunks = [LOG[i : i + 37] for i in range(0, len(LOG), 37)]
    assert follow(chunks, tty=False) == LOG
