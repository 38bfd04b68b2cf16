"""Where a rank's weights come from: a random init that does not depend on the layout, and
pipeline ranks that materialise only their own stage.

- `seeded_init`: every module is initialised by the model's own `_init_weights` from a generator
  seeded by (seed, the module's name), so a parameter's random value is the same whether the
  rank built the whole model or one stage of it (a pipeline run trains the curve of one rank).
- `stage_model`: a meta-device skeleton of the whole model in which only the modules a pipeline
  stage runs are real -- initialised by `seeded_init`, or read from the checkpoint's safetensors
  by tensor name (memory-mapped, one tensor at a time) -- so host RAM per rank is about its
  stage, not the model (launcher/memory/estimate.py counts it so).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from launcher.errors import FtlaunchError

Keep = Callable[[str], bool]  # module name (dotted, "" for the root) -> materialise it?


class StageLoadError(FtlaunchError):
    pass


def module_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


def _walk(module, prefix: str, owner, visit) -> None:
    """transformers' init order (children first, then the module), each module with the
    pretrained model that owns its `_init_weights` (a nested PreTrainedModel brings its own)."""
    from transformers.modeling_utils import PreTrainedModel

    for name, child in module.named_children():
        _walk(child, f"{prefix}{name}.", child if isinstance(child, PreTrainedModel) else owner, visit)
    visit(module, prefix.rstrip("."), owner)


def _own(module) -> list:
    return [t for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)) if t is not None]


def seeded_init(model, seed: int, keep: Keep | None = None, partitioned: bool = False) -> None:
    """(Re-)initialise every module `keep` selects (all by default) in place, from its own seed.
    Meta-device modules it selects are given CPU storage first. A tensor shared by two modules
    (tied weights) takes the first module's init, as transformers' init-then-tie does.
    `partitioned` (built under ZeRO-3's zero.Init): each module's parameters, and its direct
    children's that its init may touch, are gathered while every rank runs the same init and
    partitioned again from rank 0's values, so no rank ever holds more than one module whole."""
    import torch
    from transformers import initialization as init

    done: set[int] = set()

    def visit(module, name: str, owner) -> None:
        own = _own(module)
        if not own or (keep is not None and not keep(name)) or all(id(t) in done for t in own):
            return
        if any(t.is_meta for t in own):
            module.to_empty(device="cpu", recurse=False)
            own = _own(module)
        gathered = contextlib.nullcontext()
        if partitioned:
            import deepspeed

            params = [*module.parameters(recurse=False)]
            params += [p for child in module.children() for p in child.parameters(recurse=False)]
            gathered = deepspeed.zero.GatheredParameters(params, modifier_rank=0)
        torch.manual_seed(module_seed(seed, name))
        with gathered, torch.no_grad(), init.guard_torch_init_functions():
            owner._init_weights(module)
        if partitioned:
            release_freed_host_memory()
        done.update(id(t) for t in own)

    _walk(model, "", model, visit)


def stage_keep(config, blocks: list[int], stage: int) -> Keep:
    """The module names pipeline stage `stage` runs (launcher/parallel/stages.py): its decoder
    blocks, the embeddings (and learned positions, ...) on the first stage, the final norm and LM
    head on the last -- the embeddings again where the head is tied to them (DeepSpeed keeps the
    two copies equal) -- and the modules every block shares (rotary). `blocks`: per stage."""
    from launcher.parallel.split import STACKS

    st = STACKS[config.model_type]
    pp = len(blocks)
    start = sum(blocks[:stage])
    mine = {st.name(f"{st.layers}.{i}") for i in range(start, start + blocks[stage])}
    mine.update(st.name(m) for m in st.shared)
    if stage == 0:
        mine.update(st.name(m) for m in (st.embed, *st.first))
    if stage == pp - 1:
        mine.update(st.name(m) for m in (st.norm, *st.last))
        mine.add(st.name(st.embed) if tied(config) else st.head)

    def keep(name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in mine)

    return keep


def tied(config) -> bool:
    """Whether the LM head is the embedding matrix (transformers' default for the family applies)."""
    return bool(getattr(config, "tie_word_embeddings", False))


def _checkpoint_files(source: str) -> list[Path]:
    """The safetensors files of a local model directory or of a hub model already in the cache."""
    root = Path(source)
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        try:
            root = Path(snapshot_download(source, local_files_only=True, allow_patterns=["*.safetensors", "*.json"]))
        except Exception as exc:  # noqa: BLE001 - the hub raises many kinds; the message says which
            raise StageLoadError(f"cannot find {source!r}'s weights offline: {str(exc).splitlines()[0]}") from None
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [root / n for n in names]
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    raise StageLoadError(
        f"{source!r} has no safetensors weights (model.safetensors or its index): a pipeline rank reads "
        "only its stage's tensors by name from safetensors; convert the checkpoint "
        "(transformers: from_pretrained(...).save_pretrained(dir)) and point --model at that directory"
    )


def _copy_in(f, path: Path, key: str, target) -> None:
    """Checkpoint tensor `key` of the open safetensors file `f` into `target` (cast as it copies)."""
    import torch

    value = f.get_tensor(key)
    if value.shape != target.shape:
        raise StageLoadError(
            f"{path.name}: {key} has shape {tuple(value.shape)}, the model "
            f"{tuple(target.shape)}: the checkpoint is not this model's config"
        )
    with torch.no_grad():
        target.copy_(value)


def load_stage(model, source: str, keep: Keep) -> None:
    """Fill the meta-device skeleton's selected modules from the checkpoint by tensor name (cast
    to the skeleton's dtype, as from_pretrained casts), then compute the buffers a checkpoint
    does not hold (RoPE's inv_freq) as the model's init does."""
    from safetensors import safe_open

    wanted = {}
    for mod_name, module in model.named_modules():
        if not keep(mod_name) or not list(module.parameters(recurse=False)):
            continue
        module.to_empty(device="cpu", recurse=False)
        for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            wanted[f"{mod_name}.{name}" if mod_name else name] = t
    found = set()
    for path in _checkpoint_files(source):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                if key not in wanted:
                    continue
                _copy_in(f, path, key, wanted[key])
                found.add(key)
    persistent = set(model.state_dict().keys())
    missing = sorted(k for k in wanted if k in persistent and k not in found)
    if missing:
        raise StageLoadError(
            f"{source!r} does not hold {missing[0]} (and {len(missing) - 1} more of this stage's tensors) "
            "under the names transformers gives them, so a stage cannot be read by name; save the model with "
            "save_pretrained and point --model at that directory, or plan without --pp"
        )
    seeded_init(model, 0, lambda name: keep(name) and not list(model.get_submodule(name).parameters(recurse=False)))


def stage_model(config, source: str, init: str, seed: int, blocks: list[int], stage: int, dtype):
    """The causal LM with only pipeline stage `stage`'s modules on the CPU (the rest on the meta
    device, never allocated): from the config (`init` random) or the checkpoint."""
    import torch
    import transformers

    from launcher.parallel.split import STAGE_READ_FAMILIES

    keep = stage_keep(config, blocks, stage)
    if init == "pretrained" and config.model_type not in STAGE_READ_FAMILIES:
        # checkpoints transformers converts while loading (Mixtral's per-expert tensors become
        # fused ones): load whole, then free what other stages run
        model = transformers.AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=config._attn_implementation
        )
        for name, module in model.named_modules():
            if _own(module) and not keep(name):
                module._apply(lambda t: t.to("meta"), recurse=False)
        return model
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    if init == "random":
        seeded_init(model, seed, keep)
    else:
        load_stage(model, source, keep)
    return model


def load_partitioned(model, source: str) -> None:
    """Fill a model built under ZeRO-3's zero.Init from the checkpoint by tensor name, one module
    at a time: every rank gathers the module's parameters, rank 0 copies them in from the
    safetensors (the file opened for that module only, so its pages are not held mapped for the
    whole load) and DeepSpeed partitions them again. transformers' own ZeRO-3 loader keeps every
    checkpoint file mapped on rank 0 until the end, a second copy of the model on the node
    (bench/host_loading.py). Buffers the checkpoint holds are read by every rank (they are not
    partitioned); the others keep the values the model's init gave them."""
    import deepspeed
    import torch.distributed as dist
    from safetensors import safe_open

    files = _checkpoint_files(source)
    where: dict[str, Path] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            where.update((key, path) for key in f.keys())
    rank0 = dist.get_rank() == 0
    filled: set[int] = set()
    missing: dict[str, int] = {}  # key -> its parameter's id (a tied one may be filled by its twin)

    def read(targets: dict) -> None:
        by_file: dict[Path, list[str]] = {}
        for key in targets:
            by_file.setdefault(where[key], []).append(key)
        for path, keys in by_file.items():
            with safe_open(str(path), framework="pt") as f:
                for key in keys:
                    _copy_in(f, path, key, targets[key])

    for mod_name, module in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        params = {prefix + n: p for n, p in module.named_parameters(recurse=False) if id(p) not in filled}
        present = {k: p for k, p in params.items() if k in where}
        missing.update((k, id(p)) for k, p in params.items() if k not in where)
        if present:
            with deepspeed.zero.GatheredParameters(list(present.values()), modifier_rank=0):
                if rank0:
                    read(present)
            filled.update(id(p) for p in present.values())
            release_freed_host_memory()
        persistent = {prefix + n for n in module.state_dict(keep_vars=True) if "." not in n}
        buffers = {prefix + n: b for n, b in module.named_buffers(recurse=False) if b is not None}
        read({k: b for k, b in buffers.items() if k in persistent and k in where})
    missing = sorted(k for k, i in missing.items() if i not in filled)
    if missing:
        raise StageLoadError(
            f"{source!r} does not hold {missing[0]} (and {len(missing) - 1} more tensors) under the names "
            "transformers gives them, so ZeRO-3 cannot read it by name; save the model with save_pretrained "
            "and point --model at that directory"
        )


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


@contextlib.contextmanager
def large_allocations_returned():
    """While a rank builds and loads its model, every host allocation of 1 MiB or more is its own
    mapping, returned to the OS when freed. glibc's default raises that threshold to the size of
    the last large block freed (up to 32 MiB), so under ZeRO-3 each whole parameter a CPU rank
    creates and partitions came from the heap, and the partitions kept between them stopped the
    heap from shrinking: 4 ranks held ~2.2 model copies at the peak, 1.7 with this
    (bench/host_loading.py). Afterwards the threshold stays fixed at glibc's ceiling, where its
    default would have grown anyway. No-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 2**20)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)
            libc.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt, libc.malloc_trim  # noqa: B018 -- glibc only
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def release_freed_host_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim). A module gathered under
    ZeRO-3 on CPU ranks is freed after its copy, but glibc keeps large freed blocks in the heap
    for reuse, so the process's resident memory climbs towards the whole model while it holds a
    partition (measured: bench/host_loading.py). No-op off glibc; on GPU ranks the gathers live
    on the device."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
