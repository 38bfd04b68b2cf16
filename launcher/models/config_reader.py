"""Reading one Hugging Face config.json: required keys, transformers' defaults, one-line errors.

The family builders (hf_families.py) ask this for every number they need; a missing or
malformed key is a user error that names the key and what to do, never a KeyError.
"""

from __future__ import annotations

import copy
from typing import Any

from launcher.errors import UnknownModelError
from launcher.models.arch import ModelArch

_MISSING: Any = object()
# no size, count or length of a real model comes near this; past it, float arithmetic overflows
MAX_COUNT = 2**40

# tie_word_embeddings when config.json does not say (transformers' config class defaults).
TIE_DEFAULTS = {
    "llama": False,
    "mistral": False,
    "mixtral": False,
    "qwen2": False,
    "qwen3": False,
    "gemma": True,
    "gemma2": True,
    "qwen": False,
    "bloom": True,
    "falcon": True,
    "gpt_neox": False,
    "opt": True,
    "phi": False,
    "stablelm": False,
    "gpt2": True,
}


class ConfigReader:
    """Reads keys of one config.json; a missing or malformed required key is a user error."""

    def __init__(self, config: dict, name: str, model_type: str):
        self.d = config
        self.name = name
        self.model_type = model_type

    def get(self, *keys: str, default: Any = None) -> Any:
        """The value of the first key present (an explicit null counts as present)."""
        for key in keys:
            if key in self.d:
                return self.d[key]
        return default

    def num(self, *keys: str, default: Any = _MISSING) -> int:
        value = self.get(*keys, default=default)
        if value is None or value is _MISSING:
            also = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
            raise UnknownModelError(
                f"{self.name}: config.json (model_type {self.model_type!r}) has no {keys[0]!r}{also}; "
                "pass the model's complete Hugging Face config.json"
            )
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_COUNT:
            shown = repr(value) if len(repr(value)) < 40 else repr(value)[:37] + "..."
            raise UnknownModelError(
                f"{self.name}: config.json key {keys[0]!r} must be a positive integer up to 2^40, got {shown}; "
                "fix the config.json"
            )
        return value

    def flag(self, *keys: str, default: bool) -> bool:
        value = self.get(*keys, default=default)
        return default if value is None else bool(value)

    def tied(self) -> bool:
        return self.flag("tie_word_embeddings", default=TIE_DEFAULTS[self.model_type])

    def fail(self, what: str) -> UnknownModelError:
        return UnknownModelError(f"{self.name}: config.json (model_type {self.model_type!r}) {what}")

    def heads_split(self, hidden: int, heads: int) -> int:
        if hidden % heads:
            raise self.fail(
                f"has hidden size {hidden} not divisible by {heads} attention heads; fix the config.json"
            )
        return hidden // heads

    def arch(self, **fields: Any) -> ModelArch:
        for key in ("kv_heads", "head_dim", "ffn", "max_positions"):
            value, least = fields[key], 0 if key == "max_positions" else 1
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
                shown = repr(value) if len(repr(value)) < 40 else repr(value)[:37] + "..."
                raise self.fail(f"gives {key} = {shown}, not a positive integer up to 2^40; fix the config.json")
        heads, kv = fields["heads"], fields["kv_heads"]
        if kv <= 0 or heads % kv:
            raise self.fail(
                f"has {heads} attention heads not divisible by {kv} key/value heads; fix the config.json"
            )
        return ModelArch(
            name=self.name, model_type=self.model_type, hf_config=copy.deepcopy(self.d), **fields
        )
