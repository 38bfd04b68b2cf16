"""The model catalog: short names -> published config.json -> ModelArch.

    resolve_model("llama-3.1-8b")              catalog name (case-insensitive)
    resolve_model("meta-llama/Llama-3.1-8B")   hub id of a catalog entry
    resolve_model("./my-model")                a directory holding config.json, or the file
    resolve_model("org/name")                  a hub id found in the local Hugging Face cache

Every call is cheap: architectures are built once and cached.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UnknownModelError
from launcher.models.arch import ModelArch
from launcher.models.catalog_configs import CONFIGS
from launcher.models.hf_config import arch_from_hf_config, find_in_hf_cache, load_hf_config, looks_like_hub_id


@dataclass(frozen=True)
class ModelInfo:
    """Documentation for a catalog entry: where it lives and its published size."""

    hub_id: str | None  # None for the tiny test models
    published_params_b: float  # parameter count the publisher / hub reports, in billions
    aliases: tuple[str, ...] = ()  # other hub ids with the same architecture (instruct / renamed repos)


def _i(hub_id: str | None, params_b: float, *aliases: str) -> ModelInfo:
    return ModelInfo(hub_id, params_b, aliases)


INFO: dict[str, ModelInfo] = {
    "bloom-560m": _i("bigscience/bloom-560m", 0.559),
    "bloom-7b1": _i("bigscience/bloom-7b1", 7.069),
    "bloom-176b": _i("bigscience/bloom", 176.247, "bigscience/bloomz"),
    # LLaMA 1 (the paper's 65.2B): Meta published no hub repo; huggyllama holds the converted checkpoint
    "llama-1-65b": _i("huggyllama/llama-65b", 65.286),
    "llama-2-7b": _i("meta-llama/Llama-2-7b-hf", 6.738, "meta-llama/Llama-2-7b-chat-hf"),
    "llama-2-13b": _i("meta-llama/Llama-2-13b-hf", 13.016, "meta-llama/Llama-2-13b-chat-hf"),
    "llama-2-70b": _i("meta-llama/Llama-2-70b-hf", 68.977, "meta-llama/Llama-2-70b-chat-hf"),
    "llama-3-8b": _i("meta-llama/Meta-Llama-3-8B", 8.030, "meta-llama/Meta-Llama-3-8B-Instruct"),
    "llama-3-70b": _i("meta-llama/Meta-Llama-3-70B", 70.554, "meta-llama/Meta-Llama-3-70B-Instruct"),
    "llama-3.1-8b": _i(
        "meta-llama/Llama-3.1-8B",
        8.030,
        "meta-llama/Meta-Llama-3.1-8B",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
    ),
    "llama-3.1-70b": _i(
        "meta-llama/Llama-3.1-70B",
        70.554,
        "meta-llama/Meta-Llama-3.1-70B",
        "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
    ),
    "llama-3.1-405b": _i(
        "meta-llama/Llama-3.1-405B",
        405.853,
        "meta-llama/Meta-Llama-3.1-405B",
        "meta-llama/Llama-3.1-405B-Instruct",
        "meta-llama/Meta-Llama-3.1-405B-Instruct",
    ),
    "llama-3.2-1b": _i("meta-llama/Llama-3.2-1B", 1.236, "meta-llama/Llama-3.2-1B-Instruct"),
    "llama-3.2-3b": _i("meta-llama/Llama-3.2-3B", 3.213, "meta-llama/Llama-3.2-3B-Instruct"),
    "mistral-7b": _i("mistralai/Mistral-7B-v0.1", 7.242),
    # the v0.2 base was released as a tarball only; mistral-community holds its conversion
    "mistral-7b-v0.2": _i("mistral-community/Mistral-7B-v0.2", 7.242, "mistralai/Mistral-7B-Instruct-v0.2"),
    "mistral-7b-v0.3": _i("mistralai/Mistral-7B-v0.3", 7.248, "mistralai/Mistral-7B-Instruct-v0.3"),
    "mixtral-8x7b": _i("mistralai/Mixtral-8x7B-v0.1", 46.703),
    "mixtral-8x22b": _i("mistralai/Mixtral-8x22B-v0.1", 140.621),
    "codellama-34b": _i(
        "codellama/CodeLlama-34b-hf",
        33.744,
        "codellama/CodeLlama-34b-Instruct-hf",
        "codellama/CodeLlama-34b-Python-hf",
    ),
    "yi-34b": _i("01-ai/Yi-34B", 34.389, "01-ai/Yi-34B-Chat"),
    "qwen-7b": _i("Qwen/Qwen-7B", 7.721),
    "qwen2.5-0.5b": _i("Qwen/Qwen2.5-0.5B", 0.494),
    "qwen2.5-1.5b": _i("Qwen/Qwen2.5-1.5B", 1.544),
    "qwen2.5-3b": _i("Qwen/Qwen2.5-3B", 3.086),
    "qwen2.5-7b": _i("Qwen/Qwen2.5-7B", 7.616),
    "qwen2.5-14b": _i("Qwen/Qwen2.5-14B", 14.770),
    "qwen2.5-32b": _i("Qwen/Qwen2.5-32B", 32.764),
    "qwen2.5-72b": _i("Qwen/Qwen2.5-72B", 72.706),
    "qwen3-0.6b": _i("Qwen/Qwen3-0.6B", 0.596),
    "qwen3-8b": _i("Qwen/Qwen3-8B", 8.191),
    "gemma-2b": _i("google/gemma-2b", 2.506),
    "gemma-7b": _i("google/gemma-7b", 8.538),
    "gemma-2-2b": _i("google/gemma-2-2b", 2.614, "google/gemma-2-2b-it"),
    "gemma-2-9b": _i("google/gemma-2-9b", 9.242, "google/gemma-2-9b-it"),
    "gemma-2-27b": _i("google/gemma-2-27b", 27.227, "google/gemma-2-27b-it"),
    # Falcon model cards give nominal sizes (7B / 40B / 180B); these are the loaded models (tied head).
    "falcon-7b": _i("tiiuae/falcon-7b", 6.922),
    "falcon-40b": _i("tiiuae/falcon-40b", 41.303),
    "falcon-180b": _i("tiiuae/falcon-180B", 178.557),
    "gpt-neox-20b": _i("EleutherAI/gpt-neox-20b", 20.555),
    "opt-350m": _i("facebook/opt-350m", 0.331),
    "opt-1.3b": _i("facebook/opt-1.3b", 1.316),
    "opt-66b": _i("facebook/opt-66b", 65.7),
    "phi-1.5": _i("microsoft/phi-1_5", 1.418),
    "phi-2": _i("microsoft/phi-2", 2.780),
    "stablelm-3b": _i("stabilityai/stablelm-3b-4e1t", 2.795),
    "gpt2": _i("openai-community/gpt2", 0.124, "gpt2"),
    "gpt2-medium": _i("openai-community/gpt2-medium", 0.355, "gpt2-medium"),
    "gpt2-large": _i("openai-community/gpt2-large", 0.774, "gpt2-large"),
    "gpt2-xl": _i("openai-community/gpt2-xl", 1.558, "gpt2-xl"),
    "tiny-llama": _i(None, 0.000139584),
    "tiny-bloom": _i(None, 0.000132992),
}

# name -> config.json contents, as published on the hub (see catalog_configs.py).
CATALOG: dict[str, dict] = CONFIGS

# Other spellings users type for a catalog entry: its hub ids and a few short forms.
_EXTRA_NAMES = {
    "stablelm-3b-4e1t": "stablelm-3b",
    "phi-1_5": "phi-1.5",
    "bloom": "bloom-176b",
    "mistral-7b-v0.1": "mistral-7b",
    "llama-65b": "llama-1-65b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x22b-v0.1": "mixtral-8x22b",
}


def _build_lookup() -> dict[str, str]:
    lookup = {name: name for name in CATALOG}
    for name, info in INFO.items():
        for hub_id in (info.hub_id, *info.aliases):
            if hub_id:
                lookup.setdefault(hub_id.lower(), name)
    for extra, name in _EXTRA_NAMES.items():
        lookup.setdefault(extra, name)
    return lookup


_LOOKUP = _build_lookup()


def list_models() -> list[str]:
    """Catalog names, in catalog order (families together, small to large)."""
    return list(CATALOG)


def catalog_name(name_or_hub_id: str) -> str | None:
    """The catalog name for a catalog name or hub id (any case), else None."""
    return _LOOKUP.get(name_or_hub_id.strip().lower())


def model_info(name: str) -> ModelInfo:
    key = catalog_name(name)
    if key is None:
        raise _unknown(name)
    return INFO[key]


def resolve_model(name_or_path: str) -> ModelArch:
    """A ModelArch from a catalog name, a hub id, a config.json path or a model directory."""
    key = catalog_name(name_or_path)
    if key is not None:
        return _catalog_arch(key)
    path = Path(name_or_path).expanduser()
    try:
        is_path = path.exists()
    except (OSError, ValueError):  # longer than the filesystem allows, or a NUL byte
        is_path = False
    if is_path:
        file = path / "config.json" if path.is_dir() else path
        try:
            stat = file.stat()
        except OSError:
            return _file_arch(str(path), 0, 0)  # load_hf_config raises the right error
        return _file_arch(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if looks_like_hub_id(name_or_path) and "/" in name_or_path:
        cached = find_in_hf_cache(name_or_path)
        if cached is not None:
            stat = cached.stat()
            return _file_arch(str(cached), stat.st_mtime_ns, stat.st_size, name_or_path)
    raise _unknown(name_or_path)


@functools.cache
def _catalog_arch(name: str) -> ModelArch:
    return arch_from_hf_config(CATALOG[name], name)


@functools.lru_cache(maxsize=256)
def _file_arch(path: str, mtime_ns: int, size: int, name: str | None = None) -> ModelArch:
    """Keyed on (path, mtime, size) so an edited config.json is read again."""
    return arch_from_hf_config(load_hf_config(path), name or _display_name(path))


def _display_name(path: str) -> str:
    p = Path(path)
    return str(p.parent if p.name == "config.json" else p)


def _unknown(name: str) -> UnknownModelError:
    keys = list(CATALOG) + [k for k in _LOOKUP if k not in CATALOG]
    close = difflib.get_close_matches(name.strip().lower(), keys, n=3, cutoff=0.6)
    suggestions = list(dict.fromkeys(_LOOKUP[k] for k in close))
    hint = f" (did you mean {' or '.join(suggestions)}?)" if suggestions else ""
    hub = looks_like_hub_id(name) and "/" in name
    where = "not in the local Hugging Face cache" if hub else "no such file"
    return UnknownModelError(
        f"unknown model {name!r}{hint}: not in the catalog and {where}; "
        "run `ftlaunch models` to list catalog names, or pass a path to the model's config.json"
    )
