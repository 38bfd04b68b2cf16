"""The files ftlaunch fills in to write a run directory, read from the installed package.

The sources are the repository's top-level folders, linked here so that they ship as package data
(one copy): ds_configs/ (the reference DeepSpeed configs, documented in its README.md) and slurm/
(the sbatch template). In a wheel or a regular install they are files inside the package; in a
checkout, these links.
"""

from __future__ import annotations

from importlib import resources

from launcher.errors import FtlaunchError

DS_CONFIGS = "ds_configs"
SLURM = "slurm"


class MissingTemplateError(FtlaunchError):
    """The install lacks a file it ships with (a broken or partial install)."""


def read(folder: str, name: str) -> str:
    """The text of template `name` in `folder` (DS_CONFIGS or SLURM)."""
    path = resources.files(__package__).joinpath(folder, name)
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        raise MissingTemplateError(
            f"ftlaunch's template {folder}/{name} is missing from {resources.files(__package__)}; "
            "reinstall ftlaunch (pip install --force-reinstall ftlaunch)"
        ) from None


def names(folder: str, suffix: str) -> list[str]:
    """The template files in `folder` whose names end in `suffix`, sorted."""
    root = resources.files(__package__).joinpath(folder)
    return sorted(p.name for p in root.iterdir() if p.name.endswith(suffix))
