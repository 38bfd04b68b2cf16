"""config.json contents a user (or a broken download) can hand to --model: any value of any type in
any key the family builders read, and files that are no config.json at all. Each is planned, or
refused in one line with exit code 2; never a traceback, a hang or a file written."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli import main
from launcher.models.catalog import CATALOG

FAMILIES = ["tiny-llama", "gpt2", "bloom-560m", "falcon-7b", "mixtral-8x7b", "phi-2", "qwen3-0.6b", "opt-1.3b"]
# every key any family builder reads, and a few it might
KEYS = sorted({k for name in FAMILIES for k in CATALOG[name]} | {"rope_scaling", "head_dim", "sliding_window"})
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from([0, 1, 2, 3, 64, 10**30, 2**63, 10**400, "llama", "gpt2", "32"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
CONFIGS = st.builds(
    lambda base, edits, drops: {
        **{k: v for k, v in CATALOG[base].items() if k not in drops},
        **edits,
    },
    st.sampled_from(FAMILIES),
    st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=4),
    st.sets(st.sampled_from(KEYS), max_size=2),
)


def planned_or_one_line(argv, capsys) -> int:
    code = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err[-2000:]
    assert code in (0, 2), (code, out.err[-500:])
    if code == 2:
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ftlaunch: error:"), out.err[-500:]
    return code


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=CONFIGS)
def test_any_config_contents(config, tmp_path, capsys):
    path = tmp_path / "config.json"
    try:
        path.write_text(json.dumps(config))
    except ValueError:  # an integer json cannot write; not a file a user can have
        return
    before = set(os.listdir(tmp_path))
    planned_or_one_line(["estimate", "--model", str(path), "--gpus", "1xA100", "--json"], capsys)
    assert set(os.listdir(tmp_path)) == before


def test_a_valid_mutation_still_plans(tmp_path, capsys):
    """The fuzzer's base configs plan, so refusals come from the edits, not the bases."""
    for name in FAMILIES:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(CATALOG[name]))
        assert planned_or_one_line(["estimate", "--model", str(path), "--gpus", "8xA100", "--json"], capsys) == 0


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("utf16.json", json.dumps(CATALOG["tiny-llama"]).encode("utf-16"), "not UTF-8"),
        ("latin1.json", '{"model_type": "llama", "x": "caf\xe9"}'.encode("latin-1"), "not UTF-8"),
        ("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}\x00\x01\x02\xff", "not UTF-8"),
        ("huge.json", b" " * (5 * 2**20) + b"{}", "is no config.json"),
        ("bigint.json", b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}", "not usable JSON"),
        ("deep.json", b"[" * 100000 + b"]" * 100000, "not usable JSON"),
        ("bom.json", b"\xef\xbb\xbf" + json.dumps(CATALOG["tiny-llama"]).encode(), None),
        ("type-dict.json", json.dumps({"model_type": {"a": 1}}).encode(), "'model_type' must be text"),
        ("type-list.json", json.dumps({"model_type": ["llama"]}).encode(), "'model_type' must be text"),
    ],
)
def test_files_that_are_no_config_json(name, content, needle, tmp_path, capsys):
    (tmp_path / name).write_bytes(content)
    code = planned_or_one_line(["estimate", "--model", str(tmp_path / name), "--gpus", "1xA100"], capsys)
    if needle is None:
        assert code == 0
    else:
        assert code == 2
        assert needle in main_error(["estimate", "--model", str(tmp_path / name), "--gpus", "1xA100"], capsys)


def main_error(argv, capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_a_fifo_or_a_directory_without_config(tmp_path, capsys):
    os.mkfifo(tmp_path / "config.fifo")  # reading it would block for ever
    msg = main_error(["estimate", "--model", str(tmp_path / "config.fifo"), "--gpus", "1xA100"], capsys)
    assert "not a regular file" in msg
    (tmp_path / "model").mkdir()
    msg = main_error(["estimate", "--model", str(tmp_path / "model"), "--gpus", "1xA100"], capsys)
    assert "has no config.json" in msg
    (tmp_path / "model" / "config.json").mkdir()  # a directory where the file should be
    msg = main_error(["estimate", "--model", str(tmp_path / "model"), "--gpus", "1xA100"], capsys)
    assert "ftlaunch: error:" in msg
