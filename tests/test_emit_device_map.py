"""Device maps against the real models built on the meta device with transformers/accelerate:
every parameter placed exactly once, every key a real module, per-GPU memory within budget."""

from __future__ import annotations

import copy
import warnings

import pytest

from launcher.emit.device_map import device_map
from launcher.hardware import parse_gpus
from launcher.models.catalog import CATALOG, resolve_model
from launcher.spec import TrainSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate_utils = pytest.importorskip("accelerate.utils")


def meta_model(name: str):
    cfg = copy.deepcopy(CATALOG[name])  # transformers rewrites nested rope dicts in place
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def placement(model, dmap: dict[str, int]) -> dict[str, int]:
    """Each parameter and buffer -> the GPU of the longest device-map key that contains it."""
    out = {}
    for name, _ in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
        owners = [k for k in dmap if name == k or name.startswith(k + ".")]
        assert len(owners) == 1, (name, owners)
        out[name] = dmap[owners[0]]
    return out


MODELS = sorted(n for n in CATALOG if n != "qwen-7b")  # qwen-7b needs remote code


@pytest.mark.parametrize("name", MODELS)
def test_every_parameter_placed_exactly_once(name):
    arch = resolve_model(name)
    stages = min(4, arch.layers)
    dm = device_map(arch, TrainSpec(method="lora", grad_ckpt="full"), stages)
    model = meta_model(name)
    modules = dict(model.named_modules())
    assert all(k in modules for k in dm.device_map), [k for k in dm.device_map if k not in modules]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerate_utils.check_device_map(model, dm.device_map)  # raises if anything is unplaced
    placed = placement(model, dm.device_map)
    assert set(placed.values()) == set(range(stages))
    # blocks are contiguous and every stage has at least one
    assert [a for a, _ in dm.stages] == sorted(a for a, _ in dm.stages)
    assert sum(b - a + 1 for a, b in dm.stages) == arch.layers


def _weights_per_gpu(model, placed: dict[str, int], stages: int) -> list[float]:
    sizes = [0.0] * stages
    seen = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue  # a tied weight lives once
        seen.add(id(p))
        sizes[placed[name]] += p.numel() * 2  # bf16
    return sizes


@pytest.mark.parametrize(
    "name,gpus,method",
    [
        ("bloom-176b", "8xA100-80GB", "lora"),
        ("llama-3.1-70b", "4xA100-80GB", "lora"),
        ("mixtral-8x7b", "2xH100", "qlora"),
    ],
)
def test_big_models_split_within_budget(name, gpus, method):
    arch = resolve_model(name)
    cluster = parse_gpus(gpus)
    spec = TrainSpec(method=method, grad_ckpt="full", seq_len=2048)
    dm = device_map(arch, spec, cluster.world_size)
    budget = cluster.gpu_memory_gib * 2**30 * 0.92  # allocator margin + CUDA context
    assert max(dm.stage_bytes) <= budget, [round(b / 2**30, 1) for b in dm.stage_bytes]
    model = meta_model(name)
    placed = placement(model, dm.device_map)
    real = _weights_per_gpu(model, placed, cluster.world_size)
    if method == "lora":
        # the real 16-bit weights on each GPU stay under what the plan budgets for that GPU
        for r, est in zip(real, dm.stage_bytes, strict=True):
            assert r <= est
        # and the split is balanced: no GPU holds more than 1.5x the mean
        assert max(real) <= 1.5 * sum(real) / len(real)


def test_bloom_176b_over_8_gpus_balances_embeddings():
    arch = resolve_model("bloom-176b")
    dm = device_map(arch, TrainSpec(method="lora", grad_ckpt="full"), 8)
    counts = [b - a + 1 for a, b in dm.stages]
    # the first GPU also holds the 3.6B-parameter embedding (tied head + logits): fewer blocks
    assert counts[0] < max(counts)
    assert max(dm.stage_bytes) / min(dm.stage_bytes) < 1.3


def test_usable_with_from_pretrained_device_map_keys():
    arch = resolve_model("tiny-llama")
    dm = device_map(arch, TrainSpec(), 2).device_map
    assert dm["model.embed_tokens"] == 0 and dm["lm_head"] == 1
    assert list(dm.values()) == sorted(dm.values())


def test_the_written_device_map_json_is_what_from_pretrained_takes(tmp_path, capsys):
    import json

    from launcher.cli import main

    argv = ["--model", "tiny-llama", "--gpus", "2xA100", "--pp", "2", "--zero-stage", "1", "--init", "random"]
    assert main([*argv, "--dry-run", "--name", "pp", "--runs-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    run = tmp_path / "pp"
    with open(run / "device_map.json") as f:
        dmap = json.load(f)
    stages = json.loads((run / "device_map_stages.json").read_text())
    assert [s["gpu"] for s in stages["stages"]] == [0, 1] and len(stages["estimated_gib"]) == 2
    checkpoint = tmp_path / "checkpoint"
    meta = meta_model("tiny-llama")
    transformers.AutoModelForCausalLM.from_config(meta.config).save_pretrained(checkpoint)
    if not torch.cuda.is_available():  # the GPU indices, each read as this CPU
        dmap = {module: "cpu" for module in dmap}
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, device_map=dmap)
    assert {name for name, _ in model.named_parameters()} == {name for name, _ in meta.named_parameters()}
    if torch.cuda.is_available():
        assert model.hf_device_map == dmap
    ids = torch.randint(0, meta.config.vocab_size, (2, 16), device=model.device)
    model(input_ids=ids, labels=ids).loss.backward()  # the placed model trains
    assert all(p.device.type == ("cuda" if torch.cuda.is_available() else "cpu") for p in model.parameters())
