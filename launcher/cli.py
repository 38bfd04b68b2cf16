"""The `ftlaunch` command line: argument parsing and dispatch only.

Every error a user can cause is a FtlaunchError: printed as one line, exit code 2, no traceback
(`--debug` shows it).
"""

from __future__ import annotations

import argparse
import sys

from launcher import __version__
from launcher.errors import FtlaunchError

DESCRIPTION = """Plan, write and launch multi-GPU fine-tuning of large language models.

  ftlaunch --model llama-3.1-8b --gpus 8xH100 --method lora [--dry-run]   plan, write runs/NAME/, start it
  ftlaunch status | logs -f | cancel RUN                               watch a job
  ftlaunch report RUN                                                  its curves and memory as one HTML page
  ftlaunch plan --model bloom-176b --gpus 8xA100                         the fastest plan that fits, and why
  ftlaunch estimate --model llama-3.1-8b --gpus 1xA100 --method lora   memory of one configuration
  ftlaunch models | gpus                                               what the catalogs hold
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as ONE line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"ftlaunch: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from launcher.commands import catalogs, estimate, jobs, launch, plan, report

    parser = _Parser(
        prog="ftlaunch",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ftlaunch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    launch.add_parser(sub)
    plan.add_parser(sub)
    estimate.add_parser(sub)
    catalogs.add_parsers(sub)
    jobs.add_parsers(sub)
    report.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    program_args = None  # after `--`: the user's program's own arguments (--script / --module)
    if "--" in argv:
        i = argv.index("--")
        argv, program_args = argv[:i], argv[i + 1 :]
    debug = "--debug" in argv  # accepted anywhere on ftlaunch's part of the line
    argv = [a for a in argv if a != "--debug"]
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]  # `ftlaunch --model M --gpus G` is `ftlaunch run ...`
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (one line, see _Parser.error), --help, --version
        return exc.code if isinstance(exc.code, int) else 2
    args.debug = debug
    if program_args is not None and args.command != "run":
        sys.stderr.write("ftlaunch: error: arguments after `--` go to a --script / --module program; only the run command takes them\n")
        return 2
    args.program_args = program_args
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except FtlaunchError as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split())
        sys.stderr.write(f"ftlaunch: error: {message}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("ftlaunch: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
