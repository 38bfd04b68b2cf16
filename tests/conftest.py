"""Test-wide settings: DeepSpeed runs on its CPU accelerator here (no GPU on CI)."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every selected test N times in one session (tests/stress.sh; clusters start once)",
    )


def pytest_generate_tests(metafunc):
    n = metafunc.config.getoption("repeat")
    if n > 1:
        metafunc.fixturenames.append("_repeat")
        metafunc.parametrize("_repeat", range(1, n + 1), ids=lambda i: f"run{i}")
