"""The torchrun backend: the launch command and script for a run directory.

Single node: `torchrun --standalone --nproc-per-node N`. Multi-node: c10d rendezvous at
`--rdzv-endpoint HOST:PORT` with `--nnodes`, one agent per node. Elastic restarts with
`--max-restarts`; per-rank logs under RUN_DIR/logs/ranks.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from launcher.backends import rank_exit

DEFAULT_PORT = 29500


def command(
    run_dir: Path,
    nproc_per_node: int,
    nnodes: int = 1,
    endpoint: str | None = None,
    max_restarts: int = 0,
    run_id: str = "ftlaunch",
    python: str | None = None,
    is_host: bool | None = None,
    local_addr: str | None = None,
    program: list[str] | None = None,
) -> list[str]:
    """`program`: what each rank runs (SCRIPT ARGS or -m MODULE ARGS; default ftlaunch's worker)."""
    python = python or sys.executable
    argv = [python, "-m", "torch.distributed.run"]
    if nnodes == 1 and endpoint is None:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        argv += [
            "--nnodes",
            str(nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint or f"127.0.0.1:{DEFAULT_PORT}",
            "--rdzv-id",
            run_id,
        ]
        if is_host is not None:
            # which agent serves the rendezvous store; torchrun guesses it from the hostname,
            # which containers and network namespaces can share
            argv += ["--rdzv-conf", f"is_host={str(is_host).lower()}"]
        if local_addr:
            argv += ["--local-addr", local_addr]  # the address other nodes reach this one at
    argv += [
        "--nproc-per-node",
        str(nproc_per_node),
        "--max-restarts",
        str(max_restarts),
        "--log-dir",
        str(Path(run_dir) / "logs" / "ranks"),
        "--tee",
        "3",
        *(program or ["-m", "launcher.train", str(run_dir)]),
    ]
    return argv


_HERE = 'RUN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"'


def shell_word(arg: str, run_dir: str) -> str:
    """One shell word; the run directory is "$RUN_DIR", where the script finds itself."""
    if arg == run_dir:
        return '"$RUN_DIR"'
    if arg.startswith(run_dir + "/"):
        return '"$RUN_DIR"/' + shlex.quote(arg[len(run_dir) + 1 :])
    return shlex.quote(arg)


def script(argv: list[str], env: dict[str, str], run_dir: Path, workdir: str | None = None) -> str:
    """launch.sh: the exact command, every word quoted. Paths inside the run directory are taken
    from where the script lies, so a copied or moved run directory runs itself. `workdir`: where
    the ranks start (a user's program: where it was planned from; default the caller's)."""
    lines = [
        "#!/usr/bin/env bash",
        "# Written by ftlaunch: the exact command the torchrun backend runs.",
        "set -euo pipefail",
        _HERE,
        rank_exit.CLEAR_SHELL + "  # exit codes 75 / 2 of the last launch's ranks (backends/rank_exit.py)",
    ]
    python = shell_word(argv[0], str(run_dir))
    lines.append(
        f'[ -x {python} ] || {{ echo "launch.sh: "{python}" is not on $(hostname): run this where ftlaunch wrote it, '
        'or write the run again here (ftlaunch ... --name NAME --replan --dry-run)" >&2; exit 2; }'
    )
    for k, v in env.items():
        lines.append(f"export {k}={shell_word(v, str(run_dir))}")
    if workdir:
        w = shlex.quote(workdir)
        lines.append(
            f'cd {w} || {{ echo "launch.sh: your program starts in "{w}", which is not on $(hostname)" >&2; exit 2; }}'
        )
    lines.append("exec " + " ".join(shell_word(a, str(run_dir)) for a in argv))
    return "\n".join(lines) + "\n"


def parse(text: str, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The command and exported environment of a launch.sh, with $RUN_DIR as `run_dir`."""
    here = str(run_dir)

    def local(word: str) -> str:
        return here + word[len("$RUN_DIR") :] if word == "$RUN_DIR" or word.startswith("$RUN_DIR/") else word

    env, argv = {}, []
    for line in text.splitlines():
        if line.startswith("export "):
            k, _, v = line[7:].partition("=")
            env[k] = local(shlex.split(v)[0]) if v else ""
        elif line.startswith("exec "):
            argv = [local(a) for a in shlex.split(line.removeprefix("exec "))]
    return argv, env
