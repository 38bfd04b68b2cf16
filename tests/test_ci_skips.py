"""Under CI=true a skipped test fails the session (tests/conftest.py): CI provides everything the
suite needs, so a skip there is a broken setup that would otherwise pass as green."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEMO = """
import pytest

def test_runs():
    pass

def test_cannot():
    pytest.skip("no widget here")
"""


def run(tmp_path: Path, ci: bool, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_demo.py").write_text(DEMO)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), *args]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_fails_a_ci_run_and_is_listed(tmp_path):
    proc = run(tmp_path, ci=True)
    assert proc.returncode == 1, proc.stdout
    assert "skipped in CI (each one fails the run)" in proc.stdout
    assert "test_demo.py::test_cannot: Skipped: no widget here" in proc.stdout


def test_outside_ci_a_skip_is_only_a_skip(tmp_path):
    proc = run(tmp_path, ci=False)
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout
    assert "skipped in CI" not in proc.stdout


def test_a_ci_run_without_skips_passes(tmp_path):
    assert run(tmp_path, True, "-k", "test_runs").returncode == 0
