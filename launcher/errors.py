"""Errors a user can cause. Each prints as one line (what is wrong, what to do) and exits 2."""


class FtlaunchError(Exception):
    """Base class for every error a user can cause; the CLI prints it as one line, exit code 2."""

    exit_code = 2


class UnknownModelError(FtlaunchError):
    pass


class UnknownGpuError(FtlaunchError):
    pass


class InvalidSpecError(FtlaunchError):
    """A flag or option value that is malformed or inconsistent with another."""
