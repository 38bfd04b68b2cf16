"""A pipeline rank materialises only its stage (launcher/train/weights.py), and what it builds is
bitwise what the whole model holds under the same names: from the config (random init seeded per
module, so the layout cannot change a value) and from a safetensors checkpoint read by name. The
bytes a stage allocates are what the memory model's host term counts for it."""

from __future__ import annotations

import copy

import pytest

from launcher.models.catalog_configs import CONFIGS
from launcher.spec import TrainSpec

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launcher.train.model import ModelLoadError, build_model  # noqa: E402
from tests.test_pipeline_stages import tiny_config  # noqa: E402

LAYERS = {t: {"n_layer": 4} if t in ("gpt2", "bloom") else {"num_hidden_layers": 4} for t in (
    "gemma", "stablelm", "phi", "gpt_neox", "falcon", "gpt2", "bloom", "opt")}  # fmt: skip

LLAMA = dict(copy.deepcopy(CONFIGS["tiny-llama"]), num_hidden_layers=4)
FAMILIES = {
    "llama": LLAMA,
    "mistral": dict(LLAMA, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=16),
    "qwen2": dict(LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
    "qwen3": dict(LLAMA, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16),
    "mixtral": dict(
        LLAMA, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4, num_experts_per_tok=2
    ),
    "llama-tied": dict(LLAMA, tie_word_embeddings=True),
    # every other family with a stage adapter, 4 blocks (tests/test_pipeline_stages.py's tiny configs)
    **{t: tiny_config(t, **LAYERS[t]) for t in ("gemma", "stablelm", "phi", "gpt_neox", "falcon", "gpt2", "bloom", "opt")},
    "opt-350m": tiny_config("opt", num_hidden_layers=4, do_layer_norm_before=False, word_embed_proj_dim=32),
}
SPEC = TrainSpec(pp=2, zero_stage=1, micro_batch=1, grad_accum=2, seq_len=64)


def tensors(model) -> dict:
    return {n: t for n, t in [*model.named_parameters(), *model.named_buffers()] if not t.is_meta}


SPLITS = {2: [2, 2], 4: [1, 1, 1, 1], 3: [1, 2, 1]}


def block_of(name: str) -> int | None:
    """The decoder block a tensor belongs to (its first numeric name part), None outside blocks."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return None


def check_stages(whole, stages: list[dict], blocks: list[int], tied: bool) -> None:
    """Each stage holds exactly its own blocks; the embeddings sit on the first stage, the final
    norm and head on the last (with the embedding matrix again for a tied head); between them
    the stages hold every tensor of the whole model."""
    want = tensors(whole)
    assert set().union(*stages) == set(want)
    pp = len(blocks)
    for stage, got in enumerate(stages):
        start = sum(blocks[:stage])
        held = {block_of(n) for n in got} - {None}
        assert held == set(range(start, start + blocks[stage])), (stage, held)
        edges = {n for n in got if block_of(n) is None and "rotary" not in n}
        embedding = whole.get_input_embeddings().weight
        embed_name = next(n for n, t in want.items() if t is embedding)
        if stage == 0:
            assert embed_name in edges
        if stage == pp - 1:
            assert (embed_name in edges) == (tied or pp == 1)
            assert tied or any(n.startswith("lm_head") for n in edges)
        if 0 < stage < pp - 1:
            assert edges == set(), (stage, edges)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    hf = FAMILIES[request.param]
    whole = build_model(hf, "", SPEC, "random", 3, 0.0)
    ckpt = tmp_path_factory.mktemp(request.param)
    whole.save_pretrained(str(ckpt))
    return request.param, hf, whole, str(ckpt)


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("init", ["random", "pretrained"])
def test_every_stage_builds_exactly_its_part_of_the_whole_model(family, pp, init):
    name, hf, whole, ckpt = family
    want = tensors(whole)
    stages = []
    for stage in range(pp):
        source = ckpt if init == "pretrained" else ""
        got = tensors(build_model(hf, source, SPEC.with_(pp=pp), init, 3, 0.0, (stage, SPLITS[pp])))
        assert [n for n in got if not torch.equal(got[n], want[n])] == [], (name, pp, stage, init)
        stages.append(got)
    check_stages(whole, stages, SPLITS[pp], whole.config.tie_word_embeddings)


def test_lora_adapters_of_a_stage_equal_the_whole_models():
    spec = SPEC.with_(method="lora")
    want = tensors(build_model(LLAMA, "", spec, "random", 3, 0.0))
    for stage in range(2):
        got = tensors(build_model(LLAMA, "", spec, "random", 3, 0.0, (stage, SPLITS[2])))
        assert any("lora_A" in n for n in got)
        assert [n for n in got if not torch.equal(got[n], want[n])] == []


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_stage_allocates_what_the_memory_model_counts_for_its_loading(name):
    # tied heads included: the last stage holds the embedding matrix again, as the model counts
    from launcher.memory import states as S
    from launcher.models.hf_config import arch_from_hf_config

    hf = FAMILIES[name]
    arch = arch_from_hf_config(hf, name)
    for pp in (2, 3, 4):
        blocks = SPLITS[pp]
        for stage in range(pp):
            model = build_model(hf, "", SPEC.with_(pp=pp), "random", 3, 0.0, (stage, blocks))
            params = sum(t.numel() for n, t in model.named_parameters() if not t.is_meta)
            counted = S.stage_params(arch, SPEC.with_(pp=pp), blocks[stage], stage == 0, stage == pp - 1).total
            assert params == counted, (name, pp, stage)


def test_a_checkpoint_without_this_stages_tensors_is_one_clear_error(tmp_path):
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(512, 64, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="does not hold lm_head.weight"):
        build_model(LLAMA, str(tmp_path), SPEC, "pretrained", 3, 0.0, stage=(1, SPLITS[2]))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no safetensors weights"):
        build_model(LLAMA, str(empty), SPEC, "pretrained", 3, 0.0, stage=(0, SPLITS[2]))
