"""ftlaunch: plan, emit and launch multi-GPU fine-tuning of large language models."""

from importlib import metadata

try:
    __version__ = metadata.version("ftlaunch")  # pyproject.toml's, as installed
except metadata.PackageNotFoundError:  # a source tree that is not installed (Ray's py_modules upload)
    __version__ = "0+unknown"
