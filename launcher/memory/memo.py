"""Memoisation of the analytic model's pure per-architecture functions.

The planner evaluates thousands of configurations of one model; most of them share the parts
that depend only on the architecture and a few options (parameters per pipeline stage, the
activations of one block). `ArchMemo` keeps those results per ModelArch OBJECT (keyed by
identity, not equality: two archs that compare equal may still differ in `hf_config`, which
the activation model reads), so a cached result is exactly what the function would return.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from launcher.models.arch import ModelArch


class ArchMemo:
    """Results of a pure function of (arch, key) for the arch objects seen recently."""

    def __init__(self, maxsize: int = 1 << 15) -> None:
        self._maxsize = maxsize
        self._entries: dict[tuple[int, Hashable], tuple[ModelArch, Any]] = {}

    def get(self, arch: ModelArch, key: Hashable, compute: Callable[[], Any]) -> Any:
        slot = (id(arch), key)
        hit = self._entries.get(slot)
        if hit is not None and hit[0] is arch:  # the entry holds `arch`, so its id is not reused
            return hit[1]
        value = compute()
        if len(self._entries) >= self._maxsize:
            self._entries.clear()
        self._entries[slot] = (arch, value)
        return value
