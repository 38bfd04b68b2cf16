"""ftlaunch as a user installs it: the sdist and wheel that `python -m build` makes, the wheel installed
(not editable) with its train extra into a fresh virtual environment outside the checkout, every
dependency of the core and the train extra pinned at the lower bound pyproject.toml declares; then
the commands a new user runs, from a folder that is not the checkout.

The rest of the suite runs the editable install at the newest versions; this module is where the
declared lower bounds are installed and run (pyproject.toml says which bounds that covers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import launcher
from launcher.cli import main
from tests.runs import ROOT

pytestmark = pytest.mark.slow

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random"]
BACKENDS = ("torchrun", "slurm", "ray")
# what a dry run writes for each backend (the empty logs/, checkpoints/, output/ aside)
RUN_FILES = {"plan.json", "ds_config.json", "ds_config_hf.json", "hf_args.txt", "accelerate_config.yaml", "launch.sh", "explain.txt"}
BACKEND_FILES = {"torchrun": set(), "slurm": {"job.sbatch"}, "ray": {"ray_job.json", "ray_cluster.yaml"}}


def floors() -> list[str]:
    """`name==X` for every `name>=X` of the core dependencies and the train extra."""
    reqs = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"]["train"]]
    pins = []
    for text in reqs:
        req = Requirement(text)
        low = [s.version for s in req.specifier if s.operator == ">="]
        assert len(low) == 1, f"{text}: every dependency states one lower bound (>=)"
        pins.append(f"{req.name}=={low[0]}")
    return pins


def clean_env(extensions: Path | None = None) -> dict[str, str]:
    """The environment of a shell a user opens: no PYTHONPATH or virtual environment of the suite's.
    `extensions`: DeepSpeed's JIT-built ops go there. The build directory is named after the op
    alone and rebuilt whenever the flags (which name the venv) change, so sharing the suite's
    would make each venv rebuild the other's ops, inside some later test's timeout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)
    )
    if extensions:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    return env


def sh(argv, cwd: Path, timeout: float, check: bool = True, extensions: Path | None = None):
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=clean_env(extensions),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, (
            f"{argv[:4]} exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    sh([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=out, timeout=600)
    found = {"wheel": list(out.glob("ftlaunch-*.whl")), "sdist": list(out.glob("ftlaunch-*.tar.gz"))}
    assert all(len(v) == 1 for v in found.values()), found
    return {k: v[0] for k, v in found.items()}


# The CPU ops the fine-tunes need, JIT-built by DeepSpeed in the fresh environment (~2 min on 2 cores)
BUILD_OPS = (
    "from deepspeed.accelerator import get_accelerator\n"
    "for name in ('ShareMemCommBuilder', 'FusedAdamBuilder'):\n"
    "    op = get_accelerator().create_op_builder(name)\n"
    "    if op is not None:\n"
    "        op.load(verbose=False)\n"
)


class Install:
    def __init__(self, root: Path, work: Path):
        self.root, self.work = root, work
        self.python = root / "bin" / "python"
        self.ftlaunch = root / "bin" / "ftlaunch"
        self.ops: subprocess.Popen | None = None

    def build_ops(self) -> None:
        """Start building the ops in the background: beside the dry-run tests, not inside the first
        fine-tune's time (they are the same builds the first rank would start)."""
        env = {**clean_env(self.root / "torch_extensions"), "DS_ACCELERATOR": "cpu"}
        self.ops = subprocess.Popen(
            [self.python, "-c", BUILD_OPS], cwd=self.work, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )

    def ops_built(self) -> None:
        if self.ops is not None:
            out, _ = self.ops.communicate(timeout=1200)
            assert self.ops.returncode == 0, out[-3000:]

    def run(self, *args, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return sh(
            [self.ftlaunch, *args], self.work, timeout, check, extensions=self.root / "torch_extensions"
        )


def make_install(wheel: Path, root: Path, work: Path, extra: str) -> Install:
    """A fresh venv at `root` with the wheel (plus `extra`, e.g. "[train]") at the floors."""
    venv.EnvBuilder(with_pip=True).create(root)
    pins = root / "floors.txt"
    pins.write_text("\n".join(floors()) + "\n")
    pip = [root / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if extra:
        torch = next(p for p in floors() if p.startswith("torch=="))
        sh([*pip, torch], cwd=root, timeout=900)  # alone first: the CPU build, as tests/run.sh does
    sh([*pip, "-c", pins, f"{wheel}{extra}"], cwd=root, timeout=900)
    return Install(root, work)


@pytest.fixture(scope="module")
def install(dists, tmp_path_factory) -> Install:
    """The wheel with its train extra: what runs the worker."""
    made = make_install(dists["wheel"], tmp_path_factory.mktemp("venv"), tmp_path_factory.mktemp("user"), "[train]")
    made.build_ops()
    yield made
    if made.ops is not None and made.ops.poll() is None:
        made.ops.kill()
        made.ops.wait()


@pytest.fixture(scope="module")
def core(dists, tmp_path_factory) -> Install:
    """The wheel alone: plans, estimates and writes run directories without torch."""
    return make_install(dists["wheel"], tmp_path_factory.mktemp("venv"), tmp_path_factory.mktemp("user"), "")


@pytest.fixture(params=["core", "install"])
def either(request) -> Install:
    return request.getfixturevalue(request.param)


def test_the_wheel_holds_the_package_its_templates_and_nothing_else(dists, capsys):
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    assert {n.split("/")[0] for n in names} == {"launcher", f"ftlaunch-{VERSION}.dist-info"}
    shipped = {
        *(f"launcher/templates/ds_configs/{p.name}" for p in (ROOT / "ds_configs").iterdir()),
        *(f"launcher/templates/slurm/{p.name}" for p in (ROOT / "slurm").iterdir()),
        "launcher/data/demo_instruct.jsonl",
        f"ftlaunch-{VERSION}.dist-info/licenses/LICENSE",
    }
    assert shipped <= set(names), sorted(shipped - set(names))
    assert not [n for n in names if any(part in ("tests", "bench", "cluster") for part in n.split("/"))]
    sdist = subprocess.run(["tar", "tzf", dists["sdist"]], capture_output=True, text=True, check=True).stdout
    top = {line.split("/")[1] for line in sdist.splitlines() if line.count("/") >= 1 and line.split("/")[1]}
    assert {"launcher", "pyproject.toml", "README.md", "LICENSE"} <= top and "tests" not in top, top
    with capsys.disabled():
        for kind, path in dists.items():
            print(f"\n  {kind}: {path.name} {path.stat().st_size / 1024:.0f} KiB", end="")


def test_the_install_is_the_wheel_at_the_declared_lower_bounds(install):
    where = sh([install.python, "-c", "import launcher; print(launcher.__file__)"], install.work, 60).stdout
    assert where.startswith(str(install.root)) and "site-packages" in where, where
    listed = json.loads(
        sh([install.python, "-m", "pip", "list", "--format", "json"], install.work, 120).stdout
    )
    have = {p["name"].lower().replace("_", "-"): p["version"] for p in listed}
    for pin in floors():
        name, version = pin.split("==")
        got = have[name.lower()]
        assert Version(Version(got).public) == Version(version), f"{name} {got} installed, floor {version}"
    assert install.run("--version").stdout.strip() == f"ftlaunch {VERSION}"


def test_the_core_install_has_no_torch(core):
    listed = json.loads(sh([core.python, "-m", "pip", "list", "--format", "json"], core.work, 120).stdout)
    names = {p["name"].lower() for p in listed}
    assert "ftlaunch" in names and not names & {"torch", "deepspeed", "transformers", "numpy"}, names


def normalised(run_dir: Path, python: Path, package: Path) -> dict[str, str]:
    def text(path: Path) -> str:
        t = path.read_text()
        for real, alias in (
            (run_dir, "<RUN>"),
            (run_dir.parent, "<RUNS>"),
            (package, "<PKG>"),
            (python, "<PY>"),
        ):
            t = t.replace(str(real), alias)
        return t

    return {p.name: text(p) for p in sorted(run_dir.iterdir()) if p.is_file()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dry_run_from_the_wheel_writes_what_the_checkout_writes(either, backend, tmp_path, capsys):
    install = either
    argv = [*TINY, "--backend", backend, "--dry-run", "--name", backend]
    install.run(*argv)
    got = normalised(
        install.work / "runs" / backend,
        install.python,
        next(install.root.glob("lib/python*/site-packages/launcher")),
    )
    assert set(got) == RUN_FILES | BACKEND_FILES[backend]
    assert main([*argv, "--runs-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    want = normalised(tmp_path / backend, Path(sys.executable), Path(launcher.__file__).parent)
    assert got == want


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_estimate_and_plan_from_the_wheel_answer_as_the_checkout_does(either, command, capsys):
    install = either
    argv = [command, "--model", "llama-3.1-8b", "--gpus", "8xH100", "--method", "lora", "--json"]
    got = json.loads(install.run(*argv).stdout)
    assert main(argv) == 0
    assert got == json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "name, extra, files",
    [
        ("full", [], {"config.json", "model.safetensors", "tokenizer.json"}),
        (
            "lora",
            # LoRA's default learning rate (2e-4, for real models) barely moves the tiny random model's
            # loss in 5 steps of the default 16 sequences: within its step-to-step noise
            ["--method", "lora", "--zero-stage", "3", "--lr", "5e-3"],
            {"adapter_config.json", "adapter_model.safetensors"},
        ),
    ],
)
def test_a_two_rank_cpu_fine_tune_from_the_wheel_succeeds(install, name, extra, files):
    """The default plan (what a new user gets), and LoRA under ZeRO-3 (peft at its floor), once
    DeepSpeed's CPU ops are built in this fresh environment (started by the install fixture)."""
    install.ops_built()
    install.run(*TINY, *extra, "--max-steps", "5", "--name", name, timeout=1200)
    status = json.loads(install.run("status", "--json", f"runs/{name}").stdout)
    assert status["state"] == "SUCCEEDED", status
    losses = [
        json.loads(line)["loss"]
        for line in (install.work / "runs" / name / "logs" / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line and '"step"' in line
    ]
    assert len(losses) == 5 and losses[-1] < losses[0], losses
    assert files <= {p.name for p in (install.work / "runs" / name / "output" / "final").iterdir()}
