"""DeepSpeed, imported without the mlflow import it makes on the way.

`import deepspeed` reaches deepspeed.autotuning.autotuner, which imports mlflow at import time when
it is installed (for autotuning experiments, which ftlaunch never runs): 3-4 s of every rank's start
on 2 CPU cores, measured with python -X importtime (DeepSpeed itself takes 0.7 s). Imported first
through `load`, DeepSpeed finds mlflow absent and skips it; mlflow stays importable afterwards for
--report-to mlflow (launcher/train/tracking.py), which imports it itself.
"""

from __future__ import annotations

import sys


def load():
    """The deepspeed module; the first import in a process goes without mlflow."""
    if "deepspeed" not in sys.modules and "mlflow" not in sys.modules:
        sys.modules["mlflow"] = None  # an import of it raises ImportError, as if not installed
        try:
            import deepspeed
        finally:
            del sys.modules["mlflow"]
    import deepspeed

    return deepspeed
