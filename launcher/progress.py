"""How far a run is: step N of M, the last loss, tokens/s and the time left, for `ftlaunch status`
(from logs/metrics.jsonl) and for a followed log (from the worker's step lines), on every backend.

Followed on a terminal, the step lines become one line rewritten in place; every other line (events,
warnings, errors) is printed as it comes. Not on a terminal (a file, a pipe, CI), the log passes
through unchanged.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

TAIL_BYTES = 256 * 1024  # metrics.jsonl's end: the last step rows, whatever the file's size
RECENT = 20  # step times the ETA is the median of
_STEP = re.compile(r"\[ftlaunch\] step (\d+) \| loss (\S+)(.*)")
_FIELD = re.compile(r"(tokens_per_s|step_s) ([0-9.eE+-]+)")


def _regular(path: Path) -> bool:
    """A regular file (reading a FIFO someone put in its place would block for ever)."""
    try:
        return path.is_file()
    except OSError:
        return False


def max_steps(run_dir: Path) -> int | None:
    if not _regular(run_dir / "plan.json"):
        return None
    try:
        value = json.loads((run_dir / "plan.json").read_bytes()[: 16 * 2**20])["training"]["max_steps"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def eta(left: int, step_times: list[float]) -> float | None:
    if not step_times or left < 0:
        return None
    return left * statistics.median(step_times[-RECENT:])


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def number(value) -> bool:
    """A finite number that is not a bool (what a metrics.jsonl value must be to be shown)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) < 1e300


def summary(run_dir: Path) -> dict:
    """{"max_steps", "loss", "eta_s"} as far as logs/metrics.jsonl and plan.json tell (any key may be
    missing); whatever those files hold, never an exception."""
    out: dict = {}
    total = max_steps(run_dir)
    if total:
        out["max_steps"] = total
    if not _regular(run_dir / "logs" / "metrics.jsonl"):
        return out
    try:
        with open(run_dir / "logs" / "metrics.jsonl", "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return out
    rows = []
    for line in tail:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and number(row.get("loss")):
            rows.append(row)
    if not rows:
        return out
    out["loss"] = round(float(rows[-1]["loss"]), 4)
    times = [float(r["step_s"]) for r in rows if number(r.get("step_s")) and r["step_s"] >= 0]
    left = eta(total - rows[-1]["step"], times) if total else None
    if left is not None:
        out["eta_s"] = round(left, 1)
    return out


class Follower:
    """A `write(text)` for a followed log: on a terminal the worker's step lines become one progress
    line (step N/M, loss, tokens/s, ETA) rewritten in place; everything else passes through."""

    def __init__(self, out, total: int | None, tty: bool) -> None:
        self.out, self.total, self.tty = out, total, tty
        self.partial, self.shown, self.times = "", "", []

    def __call__(self, text: str) -> None:
        if not self.tty:
            self.out.write(text)
            self.out.flush()
            return
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line)
        self.out.flush()

    def _line(self, line: str) -> None:
        m = _STEP.search(line)
        if m is None:  # printed above the progress line, which stays at the bottom
            self.out.write(("\r\x1b[K" if self.shown else "") + line + "\n" + self.shown)
            return
        step, loss, rest = int(m.group(1)), m.group(2), m.group(3)
        fields = dict(_FIELD.findall(rest))
        if "step_s" in fields:
            self.times.append(float(fields["step_s"]))
        of = f"/{self.total}" if self.total else ""
        left = eta(self.total - step, self.times) if self.total else None
        speed = f"  {float(fields['tokens_per_s']):,.0f} tokens/s" if "tokens_per_s" in fields else ""
        self.shown = f"[ftlaunch] step {step}{of}  loss {loss}{speed}  ETA {clock(left)}"
        self.out.write("\r\x1b[K" + self.shown)

    def close(self) -> None:
        """The rest of the log, and the progress line left in place above what follows."""
        if self.partial:
            self._line(self.partial)
            self.partial = ""
        if self.shown:
            self.out.write("\n")
            self.shown = ""
        self.out.flush()
