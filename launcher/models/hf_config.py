"""Hugging Face config.json -> ModelArch, and finding a config.json on this machine.

Planning must stay fast and light: this module reads JSON with the standard library and
never imports torch, transformers or huggingface_hub. A hub id is looked up only in the
local Hugging Face cache (the layout huggingface_hub writes); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from launcher.errors import UnknownModelError
from launcher.models.arch import ModelArch
from launcher.models.config_reader import ConfigReader
from launcher.models.hf_families import ALIASES, BUILDERS

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(BUILDERS))

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?$")


def arch_from_hf_config(config: dict, name: str) -> ModelArch:
    """The exact architecture of a decoder-only model from its config.json contents.

    Raises UnknownModelError (one line, what to do) for an unsupported model_type or a
    config missing a key the architecture cannot be built without.
    """
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if not isinstance(config, dict):
        raise UnknownModelError(
            f"{name}: config.json must hold a JSON object; pass a Hugging Face config.json"
        )
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise UnknownModelError(f"{name}: config.json's 'model_type' must be text, got {type(model_type).__name__}")
    if not model_type:
        raise UnknownModelError(
            f"{name}: config.json has no 'model_type'; pass a Hugging Face config.json "
            f"of a supported model type ({supported})"
        )
    canonical = ALIASES.get(model_type, model_type)
    builder = BUILDERS.get(canonical)
    if builder is None:
        raise UnknownModelError(
            f"{name}: model_type {model_type!r} is not supported; supported model types: {supported}"
        )
    try:
        return builder(ConfigReader(config, name, canonical))
    except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError, OverflowError) as exc:
        # a value of the wrong type deep in an optional key (a list where a number goes, ...)
        raise UnknownModelError(
            f"{name}: config.json holds a value ftlaunch cannot use ({type(exc).__name__}: "
            f"{str(exc)[:120]}); fix the config.json"
        ) from None


def load_hf_config(path_or_id: str) -> dict:
    """config.json contents from a file, a model directory, or a hub id in the local HF cache."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise UnknownModelError(
                f"{path}: directory has no config.json; pass the model directory or its config.json"
            )
        return _read_json(file)
    if path.exists():  # a file, or something that is not one (refused in one line)
        return _read_json(path)
    file = find_in_hf_cache(path_or_id)
    if file is None:
        raise UnknownModelError(
            f"{path_or_id}: no such file, and no config.json for it in the local Hugging Face cache "
            f"({', '.join(str(d) for d in hf_cache_dirs())}); pass a path to the model's config.json"
        )
    return _read_json(file)


def looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and not text.startswith((".", "/", "~"))


def hf_cache_dirs() -> list[Path]:
    """Where huggingface_hub keeps downloaded repos, by its own precedence of variables."""
    env = os.environ
    dirs: list[Path] = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
        if env.get(var):
            dirs.append(Path(env[var]).expanduser())
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]).expanduser() / "hub")
    xdg = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    dirs.append(xdg / "huggingface" / "hub")
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def find_in_hf_cache(hub_id: str) -> Path | None:
    """The cached config.json of `org/name` (optionally `org/name@revision`), or None.

    Follows refs/<revision> (default main) to its snapshot; without refs, takes the most
    recently written snapshot that has a config.json.
    """
    if not looks_like_hub_id(hub_id):
        return None
    repo, _, revision = hub_id.partition("@")
    folder = "models--" + repo.replace("/", "--")
    for cache in hf_cache_dirs():
        root = cache / folder
        if not root.is_dir():
            continue
        rev = revision or "main"
        ref = root / "refs" / rev
        commit = ref.read_text().strip() if ref.is_file() else rev
        file = root / "snapshots" / commit / "config.json"
        if file.is_file():
            return file
        if revision:
            continue
        found = sorted(
            (p for p in (root / "snapshots").glob("*/config.json") if p.is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        if found:
            return found[-1]
    return None


MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few KiB; anything this big is another file


def _read_json(file: Path) -> dict:
    try:
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):
            raise UnknownModelError(f"{file}: not a regular file; pass the model's config.json")
        if info.st_size > MAX_CONFIG_BYTES:
            raise UnknownModelError(
                f"{file}: {info.st_size / 2**20:.0f} MiB is no config.json (weights?); pass the model's config.json"
            )
        raw = file.read_bytes()
    except OSError as e:
        raise UnknownModelError(
            f"{file}: cannot be read ({e.strerror}); check the path and permissions"
        ) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnknownModelError(
            f"{file}: not UTF-8 text (a weights file such as .safetensors, or another encoding); pass the "
            "model's config.json"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UnknownModelError(
            f"{file}: not valid JSON ({e.msg}, line {e.lineno}); fix or replace the file"
        ) from None
    except (ValueError, RecursionError) as e:  # an integer too long to parse, nesting too deep
        raise UnknownModelError(f"{file}: not usable JSON ({type(e).__name__}); fix or replace the file") from None
    if not isinstance(data, dict):
        raise UnknownModelError(f"{file}: does not hold a JSON object; pass a Hugging Face config.json")
    return data
