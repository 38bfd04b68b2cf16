"""All ranks resume from the checkpoint rank 0 chose (launcher.train.loop._agreed_checkpoint), in
a real 2-process gloo group: each rank is given its own view of checkpoints/, as two nodes with a
shared filesystem's stale directory cache would see it."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from pathlib import Path

import pytest

pytest.importorskip("torch")


def _checkpoint(root: Path, step: int, manifest: bool = True) -> None:
    from launcher.train import checkpoint as ckpt

    d = root / ckpt.tag_for(step)
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"w" * 100)
    if manifest:
        ckpt.write_manifest(d)


SCENARIOS = ("disagree", "lagging", "empty")


def _rank(rank: int, store: str, root: str, out) -> None:
    """One rank: each scenario's choice in turn, in one process group (spawning costs seconds)."""
    import torch.distributed as dist

    from launcher.train.loop import _agreed_checkpoint

    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        for scenario in SCENARIOS:
            run_dir = Path(root) / scenario / f"node{rank}"
            try:
                found = _agreed_checkpoint(run_dir, run_dir / "checkpoints", rank)
                out.put((scenario, rank, "ok", None if found is None else (found[0], str(found[1]))))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                out.put((scenario, rank, type(exc).__name__, str(exc)))
            dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        out.put(("crash", rank, "crash", traceback.format_exc()))


def views(root: Path, scenario: str) -> list[Path]:
    out = []
    for rank in (0, 1):
        d = root / scenario / f"node{rank}"
        (d / "logs").mkdir(parents=True)
        (d / "checkpoints").mkdir()
        out.append(d)
    return out


@pytest.fixture(scope="module")
def chosen(tmp_path_factory) -> dict[str, dict[int, tuple]]:
    root = tmp_path_factory.mktemp("choice")
    a, b = views(root, "disagree")
    _checkpoint(a / "checkpoints", 4)
    _checkpoint(a / "checkpoints", 8, manifest=False)  # rank 0 sees step 8 unfinished: skips it
    _checkpoint(b / "checkpoints", 4)
    _checkpoint(b / "checkpoints", 8)  # rank 1 alone would take step 8
    a, b = views(root, "lagging")
    _checkpoint(a / "checkpoints", 4)
    _checkpoint(a / "checkpoints", 8)
    _checkpoint(b / "checkpoints", 4)  # rank 1's view lags: no step 8
    views(root, "empty")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(root / "store"), str(root), out)) for r in (0, 1)]
    for p in procs:
        p.start()
    got: dict[str, dict[int, tuple]] = {}
    for _ in range(len(SCENARIOS) * 2):
        scenario, rank, kind, value = out.get(timeout=180)
        assert kind != "crash", value
        got.setdefault(scenario, {})[rank] = (kind, value)
    for p in procs:
        p.join(timeout=60)
    got["root"] = root
    return got


def test_every_rank_takes_rank_0s_choice_even_where_its_own_would_differ(chosen):
    node = chosen["root"] / "disagree"
    assert chosen["disagree"][0] == ("ok", (4, str(node / "node0" / "checkpoints" / "step-00000004")))
    assert chosen["disagree"][1] == ("ok", (4, str(node / "node1" / "checkpoints" / "step-00000004")))
    assert (
        '"event": "checkpoint_skipped", "step": 8' in (node / "node0" / "logs" / "metrics.jsonl").read_text()
    )


def test_a_rank_that_cannot_see_rank_0s_checkpoint_stops_with_one_clear_line(chosen):
    node = chosen["root"] / "lagging"
    assert chosen["lagging"][0] == ("ok", (8, str(node / "node0" / "checkpoints" / "step-00000008")))
    kind, message = chosen["lagging"][1]
    assert kind == "CheckpointError"
    assert f"rank 1 does not see {node / 'node1' / 'checkpoints' / 'step-00000008'}" in message
    assert "storage every node shares" in message and "\n" not in message


def test_no_checkpoint_anywhere_starts_fresh_on_every_rank(chosen):
    assert chosen["empty"] == {0: ("ok", None), 1: ("ok", None)}
