"""Build DeepSpeed's CPU ops once, before the tests (tests/run.sh runs this).

DeepSpeed JIT-compiles its C++ ops the first time a rank needs them, keyed on the build flags,
which name the virtual environment's path: a fresh clone builds them again, 2-5 minutes each on
2 cores. Left to the tests, that build lands inside whichever test first needs an op and eats its
timeout (test_train_e2e[zero3-nvme] once spent 8 of its 10 minutes compiling cpu_adam and
async_io). Built here, every test times only its own work. Ops this machine cannot build (async
I/O without libaio) are skipped with a line; the tests that need them say so themselves.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

OPS = ["ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder", "PinMemoryBuilder", "AsyncIOBuilder"]


def clear_stale_locks() -> None:
    """A build killed mid-way (a session or CI run cut off) leaves its `lock` file behind, and every
    later build of that op waits for it for ever. Nothing else builds while this runs."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    for lock in sorted(Path(root).glob("**/lock")):
        print(f"  removing a stale build lock: {lock}", flush=True)
        lock.unlink(missing_ok=True)


def main() -> int:
    from deepspeed.accelerator import get_accelerator

    clear_stale_locks()

    acc = get_accelerator()
    for name in OPS:
        builder = acc.create_op_builder(name)
        if builder is None or not builder.is_compatible(verbose=False):
            print(f"  {name}: cannot be built here, skipped", flush=True)
            continue
        t0 = time.time()
        try:
            builder.load(verbose=False)
        except Exception as exc:  # noqa: BLE001 - the tests that need it report it, with its own error
            print(f"  {name}: build failed ({type(exc).__name__}: {str(exc)[:200]}); its tests will say so", flush=True)
            continue
        print(f"  {name}: ready ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
