"""The model catalog and the HF config reader, checked against the real transformers models.

Every catalog entry is built on the meta device (no memory, no weights) and its ModelArch
must match the module tree exactly: the total parameter count, and every block linear by
leaf name, shape, bias and multiplicity.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections import Counter

import pytest

from launcher.errors import FtlaunchError, UnknownModelError
from launcher.models.catalog import CATALOG, INFO, list_models, model_info, resolve_model
from launcher.models.hf_config import SUPPORTED_MODEL_TYPES, arch_from_hf_config, load_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

# Modules outside the transformer blocks that are nn.Linear but are not block linears.
_NOT_BLOCK = {"lm_head", "project_in", "project_out"}


def _qwen_as_qwen2(cfg: dict) -> dict:
    """Qwen-7B needs remote code (not downloadable here). Qwen2 has the same module shapes:
    fused c_attn (bias) = q/k/v_proj (bias), c_proj (no bias) = o_proj, w1/w2/c_proj = up/gate/down
    at intermediate_size // 2, RMSNorms, untied head; so the counts must agree exactly."""
    return {
        "hidden_size": cfg["hidden_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_attention_heads"],
        "intermediate_size": cfg["intermediate_size"] // 2,
        "vocab_size": cfg["vocab_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rms_norm_eps": cfg["layer_norm_epsilon"],
        "tie_word_embeddings": cfg["tie_word_embeddings"],
    }


def _meta_model(config: dict):
    cfg = copy.deepcopy(config)  # transformers rewrites nested rope dicts in place
    model_type = cfg.pop("model_type")
    if model_type == "qwen":
        model_type, cfg = "qwen2", _qwen_as_qwen2(cfg)
    hf_config = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config)


def _model_linears(model) -> Counter:
    """(leaf name, fan_in, fan_out, bias) -> how many in the model, block linears only."""
    found: Counter = Counter()
    for qual, mod in model.named_modules():
        leaf = qual.rsplit(".", 1)[-1]
        if leaf in _NOT_BLOCK:
            continue
        if isinstance(mod, torch.nn.Linear):
            found[(leaf, mod.in_features, mod.out_features, mod.bias is not None)] += 1
        elif isinstance(mod, Conv1D):  # GPT-2: weight stored [in, out]
            fan_in, fan_out = mod.weight.shape
            found[(leaf, fan_in, fan_out, mod.bias is not None)] += 1
        elif isinstance(mod, torch.nn.Embedding):
            continue
        else:
            own = dict(mod.named_parameters(recurse=False))
            for pname, p in own.items():
                if p.dim() == 3:  # fused MoE experts: [experts, out, in]
                    found[(pname, p.shape[2], p.shape[1], False)] += p.shape[0]
            if set(own) == {"weight"} and own["weight"].dim() == 2:  # MoE router: [experts, hidden]
                found[(leaf, own["weight"].shape[1], own["weight"].shape[0], False)] += 1
    return found


def _arch_linears(arch) -> Counter:
    expected: Counter = Counter()
    for lin in arch.linears:
        expected[(lin.name, lin.fan_in, lin.fan_out, lin.bias)] += arch.layers * lin.count
    return expected


def _assert_matches_transformers(arch, model) -> None:
    real = sum(p.numel() for p in model.parameters())  # tied weights are listed once
    assert arch.total_params == real, f"{arch.name}: ModelArch {arch.total_params:,} != transformers {real:,}"
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert arch.tied_embeddings == tied
    if arch.model_type != "qwen":  # built as Qwen2 (different names): the count above is the check
        assert _arch_linears(arch) == _model_linears(model)


@pytest.mark.parametrize("name", list_models())
def test_catalog_entry_matches_transformers_module_tree(name):
    arch = resolve_model(name)
    _assert_matches_transformers(arch, _meta_model(CATALOG[name]))


# Missing keys take transformers' defaults for that model type; odd-but-valid variants build.
_H = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 96}
VARIANTS = {
    "llama-defaults": {"model_type": "llama", **_H, "intermediate_size": 80},
    "llama-biases": {"model_type": "llama", **_H, "intermediate_size": 80, "attention_bias": True,
                     "mlp_bias": True, "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": True},
    "mistral-defaults": {"model_type": "mistral", **_H, "num_attention_heads": 16, "intermediate_size": 80},
    "mixtral-small": {"model_type": "mixtral", **_H, "intermediate_size": 80, "num_key_value_heads": 2,
                      "num_local_experts": 4, "num_experts_per_tok": 2},
    "mixtral-defaults": {"model_type": "mixtral", **_H, "intermediate_size": 40, "num_key_value_heads": 2},
    "qwen2-defaults": {"model_type": "qwen2", **_H, "num_attention_heads": 64, "hidden_size": 128,
                       "intermediate_size": 80},
    "qwen3-defaults": {"model_type": "qwen3", **_H, "intermediate_size": 80, "num_key_value_heads": 2,
                       "attention_bias": True},
    "gemma-defaults": {"model_type": "gemma", **_H, "num_attention_heads": 32, "intermediate_size": 80},
    "gemma2-defaults": {"model_type": "gemma2", **_H, "num_attention_heads": 8, "intermediate_size": 80},
    "gemma2-untied-biased": {"model_type": "gemma2", **_H, "intermediate_size": 80, "num_key_value_heads": 2,
                             "head_dim": 32, "attention_bias": True, "tie_word_embeddings": False},
    "stablelm-variant": {"model_type": "stablelm", **_H, "num_attention_heads": 32, "hidden_size": 128,
                         "intermediate_size": 80, "qk_layernorm": True, "use_parallel_residual": True,
                         "use_qkv_bias": True, "tie_word_embeddings": True},
    "phi-variant": {"model_type": "phi", **_H, "intermediate_size": 80, "qk_layernorm": True,
                    "num_key_value_heads": 2, "tie_word_embeddings": True},
    "bloom-untied": {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 96,
                     "tie_word_embeddings": False},
    "falcon-mha-sequential": {"model_type": "falcon", **_H, "multi_query": False, "parallel_attn": False,
                              "bias": True, "ffn_hidden_size": 100},
    "falcon-new-no-kv": {"model_type": "falcon", **_H, "new_decoder_architecture": True},
    "falcon-new-one-ln": {"model_type": "falcon", **_H, "new_decoder_architecture": True, "num_kv_heads": 2,
                          "num_ln_in_parallel_attn": 1, "tie_word_embeddings": False},
    "gpt_neox-variant": {"model_type": "gpt_neox", **_H, "intermediate_size": 80, "attention_bias": False,
                         "tie_word_embeddings": True},
    "opt-post-ln-no-affine": {"model_type": "opt", **_H, "ffn_dim": 80, "do_layer_norm_before": False,
                              "layer_norm_elementwise_affine": False, "enable_bias": False,
                              "word_embed_proj_dim": 32, "max_position_embeddings": 40,
                              "tie_word_embeddings": False},
    "gpt2-untied": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 96,
                    "n_positions": 40, "n_inner": 100, "tie_word_embeddings": False},
}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_variants_and_defaults_match_transformers(variant):
    arch = arch_from_hf_config(VARIANTS[variant], variant)
    _assert_matches_transformers(arch, _meta_model(VARIANTS[variant]))


def test_defaults_follow_transformers():
    assert arch_from_hf_config(VARIANTS["llama-defaults"], "x").kv_heads == 4  # = attention heads
    assert arch_from_hf_config(VARIANTS["mistral-defaults"], "x").kv_heads == 8
    assert arch_from_hf_config(VARIANTS["qwen2-defaults"], "x").kv_heads == 32
    assert arch_from_hf_config(VARIANTS["qwen3-defaults"], "x").head_dim == 128
    gemma = arch_from_hf_config(VARIANTS["gemma-defaults"], "x")
    assert (gemma.head_dim, gemma.kv_heads, gemma.tied_embeddings, gemma.lm_head_params) == (256, 16, True, 0)
    gemma2 = arch_from_hf_config(VARIANTS["gemma2-defaults"], "x")
    assert (gemma2.head_dim, gemma2.kv_heads, gemma2.tied_embeddings) == (256, 4, True)
    assert gemma2.layer_norm_params == 4 * 64  # input, post_attention, pre_ and post_feedforward norms
    assert arch_from_hf_config(VARIANTS["bloom-untied"], "x").lm_head_params == 96 * 64


def test_published_parameter_counts():
    exact = {
        "llama-3.1-8b": 8_030_261_248,
        "llama-1-65b": 65_285_660_672,
        "yi-34b": 34_388_917_248,
        "codellama-34b": 33_743_970_304,
        "llama-3-70b": 70_553_706_496,
        "gemma-2-2b": 2_614_341_888,
        "gemma-2-9b": 9_241_705_984,
        "gemma-2-27b": 27_227_128_320,
        "llama-2-7b": 6_738_415_616,
        "llama-3.1-405b": 405_853_388_800,
        "bloom-176b": 176_247_271_424,
        "mixtral-8x7b": 46_702_792_704,
        "gpt-neox-20b": 20_554_567_680,
        "gpt2": 124_439_808,
    }
    for name, count in exact.items():
        assert resolve_model(name).total_params == count, name
    for name in list_models():
        pub = INFO[name].published_params_b * 1e9
        assert abs(resolve_model(name).total_params - pub) / pub < 0.01, name
    mixtral = resolve_model("mixtral-8x7b")
    assert 12.8e9 < mixtral.active_params_per_token < 13.0e9  # "13B active"
    assert (mixtral.experts, mixtral.experts_per_token) == (8, 2)


def test_catalog_covers_required_models_and_architecture_facts():
    required = """bloom-560m bloom-7b1 bloom-176b llama-2-7b llama-2-13b llama-2-70b llama-3.1-8b llama-3.1-70b
    llama-3.1-405b llama-3.2-1b llama-3.2-3b mistral-7b mixtral-8x7b qwen-7b qwen2.5-7b qwen2.5-14b qwen2.5-32b
    qwen2.5-72b falcon-40b falcon-180b gpt-neox-20b opt-66b phi-1.5 phi-2 stablelm-3b gpt2 tiny-llama
    tiny-bloom llama-1-65b yi-34b codellama-34b llama-3-8b llama-3-70b mistral-7b-v0.2 mistral-7b-v0.3
    gemma-2-2b gemma-2-9b gemma-2-27b""".split()
    assert set(required) <= set(list_models())
    assert set(INFO) == set(CATALOG)
    llama = resolve_model("llama-3.1-8b")
    assert (llama.kv_heads, llama.head_dim, llama.gated_mlp, llama.tied_embeddings) == (8, 128, True, False)
    assert " ".join(llama.linear_names()) == "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"
    assert llama.lm_head_params == 128256 * 4096 and llama.max_positions == 131072
    bloom = resolve_model("bloom-176b")
    assert bloom.embedding_params == 250880 * 14336 + 2 * 14336 and bloom.lm_head_params == 0
    assert resolve_model("falcon-40b").kv_heads == 8 and resolve_model("falcon-7b").kv_heads == 1
    assert resolve_model("phi-2").lm_head_params == 51200 * 2560 + 51200  # biased LM head
    router = [lin for lin in resolve_model("mixtral-8x7b").linears if lin.role == "router"]
    assert [(r.name, r.parallel, r.fan_out) for r in router] == [("gate", "replicated", 8)]
    tiny = resolve_model("tiny-llama")
    assert (tiny.hidden, tiny.layers, tiny.heads, tiny.kv_heads, tiny.ffn, tiny.tied_embeddings) == (
        64, 2, 4, 2, 128, False,
    )  # fmt: skip
    qwen = resolve_model("qwen-7b")
    assert qwen.linear_names() == ["c_attn", "c_proj", "w1", "w2", "c_proj"] and qwen.ffn == 11008
    gpt2 = resolve_model("gpt2")  # Conv1D: fan_in / fan_out are still in -> out
    assert [(lin.name, lin.fan_in, lin.fan_out) for lin in gpt2.linears][2:] == [
        ("c_fc", 768, 3072), ("c_proj", 3072, 768),
    ]  # fmt: skip


# ---- resolve_model -----------------------------------------------------------------------------
def test_resolve_catalog_name_is_case_insensitive_and_cached():
    arch = resolve_model("llama-3.1-8b")
    assert arch.name == "llama-3.1-8b" and arch.model_type == "llama"
    assert resolve_model("  LLaMA-3.1-8B ") is arch
    start = time.perf_counter()
    for _ in range(10_000):
        resolve_model("llama-3.1-8b")
    assert (time.perf_counter() - start) / 10_000 < 50e-6


@pytest.mark.parametrize(
    "hub_id, name",
    [
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("bigscience/bloom", "bloom-176b"),
        ("Qwen/Qwen-7B", "qwen-7b"),
        ("stabilityai/stablelm-3b-4e1t", "stablelm-3b"),
        ("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("mistral-community/Mistral-7B-v0.2", "mistral-7b-v0.2"),
    ],
)
def test_resolve_hub_id_of_catalog_entry(hub_id, name):
    assert resolve_model(hub_id) is resolve_model(name)
    assert model_info(hub_id) is INFO[name]


def test_resolve_directory_and_file(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(CATALOG["tiny-llama"]))
    expected = resolve_model("tiny-llama").total_params
    from_dir = resolve_model(str(model_dir))
    assert from_dir.total_params == expected and from_dir.name == str(model_dir)
    assert resolve_model(str(model_dir / "config.json")).total_params == expected
    # an edited config.json is read again (cache keyed on mtime and size)
    (model_dir / "config.json").write_text(json.dumps({**CATALOG["tiny-llama"], "num_hidden_layers": 12}))
    assert resolve_model(str(model_dir)).layers == 12


def test_resolve_hub_id_from_local_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--acme--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(CATALOG["tiny-bloom"]))
    arch = resolve_model("acme/tiny")
    assert arch.model_type == "bloom" and arch.total_params == resolve_model("tiny-bloom").total_params
    assert load_hf_config("acme/tiny")["n_layer"] == 2
    with pytest.raises(UnknownModelError, match="local Hugging Face cache"):
        load_hf_config("acme/absent")


def test_unknown_name_suggests_catalog_name():
    with pytest.raises(UnknownModelError) as err:
        resolve_model("lama-3.1-8b")
    msg = str(err.value)
    assert (
        "did you mean" in msg and "llama-3.1-8b" in msg and "ftlaunch models" in msg and "config.json" in msg
    )
    assert "\n" not in msg and isinstance(err.value, FtlaunchError)


def test_unknown_hub_id_not_in_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UnknownModelError, match="not in the local Hugging Face cache"):
        resolve_model("nobody/nothing-7b")


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(UnknownModelError) as err:
        resolve_model(str(tmp_path))
    msg = str(err.value)
    assert "'t5' is not supported" in msg and "llama" in msg and "\n" not in msg
    assert set(SUPPORTED_MODEL_TYPES) >= {"llama", "bloom", "falcon", "qwen", "gpt2", "mixtral"}


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 8,
          "intermediate_size": 8}, "'hidden_size'"),
        ({"model_type": "bloom", "n_layer": 2, "n_head": 4, "vocab_size": 8}, "'hidden_size' (or 'n_embed')"),
        ({"model_type": "llama", **_H, "intermediate_size": "big"}, "positive integer"),
        ({"model_type": "llama", **_H, "hidden_size": 66, "intermediate_size": 8}, "not divisible"),
        ({"hidden_size": 64}, "no 'model_type'"),
    ],
)  # fmt: skip
def test_bad_configs_raise_one_line_errors(config, needle):
    with pytest.raises(UnknownModelError) as err:
        arch_from_hf_config(config, "my-model")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_files(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UnknownModelError, match="not valid JSON"):
        load_hf_config(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UnknownModelError, match="has no config.json"):
        resolve_model(str(empty))


def test_planning_imports_stay_light():
    code = (
        "import sys, launcher.models.catalog as c; c.resolve_model('llama-3.1-8b');"
        "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'huggingface_hub')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
