"""The Slurm batch script of a run: its options (validated) and rendering slurm/job.sbatch.j2.

Pure: no Slurm command runs here, so the dry run works on any machine. Every value a user gives
is validated here and quoted in the script: in `#SBATCH` directives the way sbatch reads them
(double quotes, backslash escapes; sbatch knows no single quotes and takes an unescaped `#` as
the start of a comment), in shell lines with shlex. A newline in any value is refused: it would
start a new line of the script. The --setup lines are the only user text that runs as commands.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from launcher import __version__, templates
from launcher.backends import rank_exit
from launcher.errors import InvalidSpecError

TEMPLATE = "job.sbatch.j2"
SCRIPT = "job.sbatch"
PREEMPTED = rank_exit.PREEMPTED  # a rank's exit code after a checkpoint on SIGTERM / SIGUSR1

_IDENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # partition, account, qos names
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.\-&|,*:\[\]()!]{1,512}$")  # a --constraint feature expression
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PLAIN = re.compile(r"^[A-Za-z0-9_.,:/@%+=\-\[\]]+$")  # needs no quoting in a directive
# directives ftlaunch sets from the plan and the run directory; --sbatch-line may not change them
_MANAGED = ("nodes", "ntasks", "ntasks-per-node", "output", "error", "chdir", "open-mode")
_MANAGED_SHORT = ("-N", "-n", "-o", "-e", "-D")
# bash -c program every node runs before exec'ing torchrun: the head (node 0) hosts the
# rendezvous store. Set per node, as torchrun's own guess from hostnames misfires when nodes
# share a hostname or an address (containers, test clusters).
# Each node first checks what a copied environment gets wrong: the run directory and the interpreter
# must be there (shared storage, the same path); else one line naming the node, exit 2.
_NODE_CHECK = (
    '[ -f "$RUN_DIR/plan.json" ] || { echo "[ftlaunch] $(hostname) does not see $RUN_DIR: the run directory must '
    'be on storage every node mounts at the same path" >&2; exit 2; }; '
    'command -v "$1" >/dev/null || { echo "[ftlaunch] $(hostname) has no $1: give --python the interpreter the '
    'nodes have (python: the one --setup puts on PATH)" >&2; exit 2; }; '
)
NODE_SHIM = _NODE_CHECK + 'export PET_RDZV_CONF="is_host=$((SLURM_NODEID == 0))"; exec "$@"'
# accelerate launch takes the node's rank and the host flag as options: the shim puts them in place
# of their placeholder words (bash's ${@//...} replaces in every argument)
ACCELERATE_NODE_SHIM = _NODE_CHECK + (
    'set -- "${@//@FTLAUNCH_NODE@/$SLURM_NODEID}"; '
    'set -- "${@//@FTLAUNCH_IS_HOST@/is_host=$((SLURM_NODEID == 0))}"; exec "$@"'
)
# launcher words the batch script fills in at run time (per node inside srun: single-quoted there)
_ENDPOINT, _RDZV_ID = "@FTLAUNCH_HEAD@", "@FTLAUNCH_JOB_ID@"
_HEAD, _PORT, _NODE_RANK, _IS_HOST = "@FTLAUNCH_HEAD_ADDR@", "@FTLAUNCH_PORT@", "@FTLAUNCH_NODE@", "@FTLAUNCH_IS_HOST@"
_SHELL_WORDS = {
    _ENDPOINT: '"$HEAD_ADDR:$RDZV_PORT"',
    _RDZV_ID: '"$SLURM_JOB_ID"',
    _HEAD: '"$HEAD_ADDR"',
    _PORT: '"$RDZV_PORT"',
}


class SlurmSpecError(InvalidSpecError):
    """A Slurm option the user gave is malformed."""


def _one_line(value: str, flag: str) -> str:
    if not value.strip() or _CONTROL.search(value):
        raise ValueError(f"{flag} must be one non-empty line of text (no newlines or control characters)")
    return value


def _managed(word: str) -> bool:
    """Whether an sbatch option sets what ftlaunch manages; sbatch takes any unambiguous prefix of
    a long option (--node=2), and a short option's value attached (-N2)."""
    if word.startswith("--"):
        return any(name.startswith(word[2:]) for name in _MANAGED)
    return word[:2] in _MANAGED_SHORT


class SlurmOptions(BaseModel):
    """The Slurm part of a run: stored in plan.json's backend, rendered into job.sbatch."""

    model_config = ConfigDict(extra="forbid")

    job_name: str | None = Field(None, max_length=200)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    constraint: str | None = None
    cpus_per_node: int | None = Field(None, ge=1)
    mem: str = "0"  # per node; 0 = all of the node's memory
    sbatch_lines: list[str] = []
    setup: list[str] = []
    container_image: str | None = None
    python: str | None = None  # the interpreter on the nodes (default: the one that wrote the script)
    signal_lead: int = Field(180, ge=10, le=86400)
    max_requeues: int = Field(3, ge=0, le=1000)

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, v):
        return None if v is None else _one_line(v, "--job-name")

    @field_validator("python")
    @classmethod
    def _python(cls, v):
        return None if v is None else _one_line(v, "--python")

    @field_validator("partition", "account", "qos")
    @classmethod
    def _ident(cls, v, info):
        if v is not None and not _IDENT.match(v):
            raise ValueError(
                f"--{info.field_name} {v[:40]!r} is not a Slurm name (letters, digits, '_', '.', '-')"
            )
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v):
        if v is not None and not _TIME.match(v):
            raise ValueError(f"--time {v[:40]!r}: use MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED")
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v):
        if v is not None and not _CONSTRAINT.match(v):
            raise ValueError(f"--constraint {v[:40]!r} is not a feature expression (e.g. 'a100&ib')")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v):
        if not _MEM.match(v):
            raise ValueError(f"--mem {v[:40]!r}: use a size like 500G or 0 (all of the node's memory)")
        return v

    @field_validator("sbatch_lines")
    @classmethod
    def _sbatch_lines(cls, lines):
        for line in lines:
            _one_line(line, "--sbatch-line")
            if not line.startswith("-"):
                raise ValueError(
                    f"--sbatch-line {line[:40]!r} must be an sbatch option, e.g. --mail-type=END"
                )
            word = re.split(r"[=\s]", line, maxsplit=1)[0]
            if _managed(word):
                raise ValueError(
                    f"--sbatch-line may not set {word}: ftlaunch sets it from the plan and run dir"
                )
        return lines

    @field_validator("setup")
    @classmethod
    def _setup(cls, lines):
        return [_one_line(line, "--setup") for line in lines]

    @field_validator("container_image")
    @classmethod
    def _image(cls, v):
        if v is not None and (not v or re.search(r"[\s\x00-\x1f\x7f]", v)):
            raise ValueError(f"--container-image {v[:40]!r} must be one word")
        return v


def options(**values) -> SlurmOptions:
    """SlurmOptions from flag values; a bad value is one line naming the flag."""
    try:
        return SlurmOptions(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] != "value_error":
            msg = f"--{str(first['loc'][0]).replace('_', '-')}: {msg}"
        raise SlurmSpecError(msg) from None


def directive(value: str) -> str:
    """Quote a value for an `#SBATCH` line the way sbatch parses it."""
    if _CONTROL.search(value):
        raise SlurmSpecError(f"{value[:40]!r} holds a newline or control character")
    if _PLAIN.match(value):
        return value
    return '"' + re.sub(r'([\\"#])', r"\\\1", value) + '"'


def submit_argv(run_dir: Path) -> list[str]:
    """sbatch for job.sbatch, run from its run directory (the script names no absolute path of it:
    a copied or moved run directory submits itself)."""
    return ["sbatch", "--parsable", f"--chdir={Path(run_dir)}", str(Path(run_dir) / SCRIPT)]


def render(
    run_dir: Path,
    run_name: str,
    nnodes: int,
    gpus_per_node: int,
    max_restarts: int,
    env: dict[str, str],
    opts: SlurmOptions,
    python: str | None = None,
    program: list[str] | None = None,
    workdir: str | None = None,
    launcher: str = "torchrun",
) -> str:
    """job.sbatch for a run directory: `nnodes` nodes, one torchrun agent per node, each starting
    `gpus_per_node` ranks of ftlaunch's worker, or `program` (torchrun.command) from `workdir`,
    started by `launcher` (torchrun, or accelerate: backends/accelerate_launch.py)."""
    import jinja2

    from launcher.backends import accelerate_launch, torchrun

    run_dir = Path(run_dir)
    if _CONTROL.search(str(run_dir)):
        raise SlurmSpecError(
            f"{str(run_dir)[:60]!r}: a run directory path with a newline or control character"
        )
    if "%" in str(run_dir):
        raise SlurmSpecError(
            f"{run_dir}: Slurm reads '%' in output paths as a pattern; use another --runs-dir"
        )
    python = python or opts.python or ("python" if opts.container_image else None)
    shim = NODE_SHIM
    if launcher == "accelerate":
        argv = accelerate_launch.command(
            run_dir, gpus_per_node, nnodes, program, f"{_HEAD}:{_PORT}", max_restarts, python, _NODE_RANK, _IS_HOST
        )
        shim = ACCELERATE_NODE_SHIM
    else:
        argv = torchrun.command(
            run_dir, gpus_per_node, nnodes, _ENDPOINT, max_restarts, run_id=_RDZV_ID, python=python, program=program
        )
    srun = [
        f"--nodes={nnodes}",
        f"--ntasks={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        f"--cpus-per-task={opts.cpus_per_node}"
        if opts.cpus_per_node
        else '--cpus-per-task="$SLURM_CPUS_ON_NODE"',
    ]
    if workdir:  # a user's program starts where it was planned from
        srun.append("--chdir=" + shlex.quote(workdir))
    if opts.container_image and program:
        raise SlurmSpecError(
            "--container-image runs ftlaunch's worker only: the container would see the run directory but not "
            "your program or the directory it starts from; drop --container-image (use --setup to prepare the nodes)"
        )
    if opts.container_image:  # pyxis; the run directory is mounted at the same path
        srun += [
            "--container-image=" + shlex.quote(opts.container_image),
            '--container-mounts="$RUN_DIR:$RUN_DIR"',
            '--container-workdir="$RUN_DIR"',
        ]
    for key in env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise SlurmSpecError(f"{key[:40]!r} is not an environment variable name")
    jenv = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    jenv.filters.update(q=lambda v: shlex.quote(str(v)), directive=directive)
    return jenv.from_string(templates.read(templates.SLURM, TEMPLATE)).render(
        version=__version__,
        script=SCRIPT,
        run_name=run_name,
        submit=f"cd RUN_DIR && sbatch {SCRIPT}  (what `ftlaunch launch RUN_DIR` runs)",
        job_name=opts.job_name or run_name,
        nodes=nnodes,
        gpus_per_node=gpus_per_node,
        o=opts.model_dump(),
        env={k: torchrun.shell_word(v, str(run_dir)) for k, v in env.items()},
        shutdown_timeout=max(5, opts.signal_lead - 15),
        srun=srun,
        node_shim=shim,
        torchrun=[_SHELL_WORDS.get(word) or torchrun.shell_word(word, str(run_dir)) for word in argv],
        preempted_code=PREEMPTED,
        clear_markers=rank_exit.CLEAR_SHELL,
    )
