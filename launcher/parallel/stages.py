"""Stage adapters: a Hugging Face causal LM as the flat list of layers DeepSpeed's pipeline engine
runs, and the loss on the last stage:

    [Embed, Enter, Block x layers, Exit, Head]

- Embed: the token embedding (ids -> hidden).
- Enter: what the family adds before its first block: learned positions (GPT-2, OPT), OPT's input
  projection, BLOOM's embedding LayerNorm, embedding dropout (GPT-2, GPT-NeoX, Phi).
- Block: one decoder layer with what the model's forward would hand it, derived from the
  sequence itself (positions 0..s-1, the causal mask, rotary embeddings or ALiBi).
- Exit: the final norm (and OPT's output projection); Head: the LM head.

The layers wrap the model's own modules (no copy), so a LoRA model's adapters train inside the
stages and the export reads the trained weights back by their Hugging Face names. Only hidden
states travel between stages (launcher/train/data.py pads on the right and passes no attention
mask). Where the LM head is the embedding matrix (GPT-2, BLOOM, OPT, Gemma, small Llama / Qwen),
Embed and Head are one DeepSpeed TiedLayerSpec: the first and the last stage each hold the
matrix, DeepSpeed sums its two gradients across them every step and keeps the copies equal
(broadcast from the first stage when built and when a checkpoint is loaded).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from launcher.parallel.split import STACKS, pipeline_refusal

IGNORE = -100
TIED_KEY = "embeddings"


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


class _Part(nn.Module):
    """A layer over some of the model's own modules: `owned` are registered (their parameters
    train in this stage); `base`, the decoder stack, is reachable without being registered (its
    other modules belong to other stages and stay on the meta device here)."""

    def __init__(self, lm, owned: dict[str, nn.Module | None] | None = None) -> None:
        super().__init__()
        owned = owned or {}
        self.owned = nn.ModuleDict({k.replace(".", "_"): m for k, m in owned.items() if m is not None})
        st = STACKS[lm.config.model_type]
        object.__setattr__(self, "base", lm.get_submodule(st.base))
        object.__setattr__(self, "config", lm.config)


class Embed(nn.Module):
    """The token embedding; `vocab` (launcher/parallel/tensor.py) when it is split by vocabulary
    over a TP group."""

    def __init__(self, embedding: nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.vocab = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.vocab is not None:
            return self.vocab.lookup(self.embedding, input_ids)
        return self.embedding(input_ids)


def tied_head(embed: Embed, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head of a tied model on the last stage: the embedding matrix as a bias-free linear."""
    if embed.vocab is not None:
        return embed.vocab.logits(embed.embedding.weight, hidden)
    return nn.functional.linear(hidden, embed.embedding.weight)


class Enter(_Part):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kind, base = self.config.model_type, self.base
        if kind == "gpt2":
            return base.drop(hidden + base.wpe(_positions(hidden)))
        if kind == "opt":
            positions = _positions(hidden)
            ones = torch.ones(hidden.shape[:2], device=hidden.device)
            if base.project_in is not None:
                hidden = base.project_in(hidden)
            return hidden + base.embed_positions(ones, 0, position_ids=positions)
        if kind == "bloom":
            return base.word_embeddings_layernorm(hidden)
        if kind == "gpt_neox":
            return base.emb_dropout(hidden)
        if kind == "phi":
            return base.embed_dropout(hidden)
        return hidden


class Block(_Part):
    """One decoder layer with what the model's forward would hand it."""

    def __init__(self, lm, layer: nn.Module, index: int) -> None:
        super().__init__(lm)
        self.layer = layer
        self.sliding = _sliding(lm.config, index)
        self.heads = slice(None)  # the attention heads this rank computes (a TP group's share)
        # rotary Falcons: transformers < 5.25 asks for the (absent) ALiBi bias by name
        self.no_alibi = {"alibi": None} if "alibi" in inspect.signature(layer.forward).parameters else {}

    def _mask(self, hidden, positions, **extra):
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        make = create_sliding_window_causal_mask if self.sliding else create_causal_mask
        return make(
            config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=positions, **extra
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kind, base = self.config.model_type, self.base
        positions = _positions(hidden)
        if kind == "bloom":
            out = self.layer(hidden, alibi=_bloom_alibi(base.num_heads, hidden, self.heads), attention_mask=self._mask(hidden, None))
        elif kind in ("gpt2", "opt"):
            out = self.layer(hidden, attention_mask=self._mask(hidden, positions), position_ids=positions)
        else:
            extra = {"allow_is_causal_skip": False} if kind == "falcon" else {}
            out = self.layer(
                hidden,
                attention_mask=self._mask(hidden, positions, **extra),
                position_ids=positions,
                position_embeddings=base.rotary_emb(hidden, position_ids=positions),
                **self.no_alibi,
            )
        return out[0] if isinstance(out, tuple) else out


def _bloom_alibi(heads: int, hidden: torch.Tensor, mine: slice) -> torch.Tensor:
    """BLOOM's ALiBi bias without padding, as BloomModel builds it when given no attention mask,
    for the heads `mine` of `heads`."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    batch, seq = hidden.shape[:2]
    slopes = _get_alibi_slopes(heads, hidden.device)[mine]
    alibi = slopes[:, None, None] * torch.arange(seq, device=hidden.device)
    return alibi.repeat(batch, 1, 1).to(hidden.dtype)


class Exit(_Part):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for module in self.owned.values():
            hidden = module(hidden)
        return hidden


class Head(nn.Module):
    def __init__(self, lm_head: nn.Module) -> None:
        super().__init__()
        self.lm_head = lm_head
        self.vocab = None  # as Embed's

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.vocab is not None:
            return self.vocab.logits(self.lm_head.weight, hidden)
        return self.lm_head(hidden)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Transformers' causal-LM loss: next-token cross-entropy in fp32, mean over the labelled
    tokens of the micro-batch."""
    shifted = nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:]
    return nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), shifted.reshape(-1), ignore_index=IGNORE
    )


def _sliding(config, index: int) -> bool:
    """Whether block `index` attends within a sliding window, as the family's forward decides."""
    if config.model_type in ("qwen2", "qwen3"):
        return getattr(config, "layer_types", ["full_attention"] * (index + 1))[index] == "sliding_attention"
    if config.model_type in ("mistral", "mixtral"):
        return getattr(config, "sliding_window", None) is not None
    return False


def causal_lm(model) -> nn.Module:
    """The transformers causal LM inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_tied(lm) -> bool:
    return bool(getattr(lm.config, "tie_word_embeddings", False))


def stage_layers(model) -> list:
    """[Embed, Enter, Block x layers, Exit, Head] for a model whose family has an adapter; Embed and
    Head are one TiedLayerSpec where the head is the embedding matrix."""
    lm = causal_lm(model)
    config = lm.config
    why = pipeline_refusal(config.model_type, config.model_type, bool(getattr(config, "alibi", False)))
    if why is not None:
        raise ValueError(why)  # the planner refuses these before any rank starts
    st = STACKS[config.model_type]
    base = lm.get_submodule(st.base)
    embedding = base.get_submodule(st.embed)
    enter = Enter(lm, {m: getattr(base, m) for m in st.first})
    blocks = [Block(lm, layer, i) for i, layer in enumerate(base.get_submodule(st.layers))]
    exit_ = Exit(lm, {m: getattr(base, m) for m in (st.norm, *st.last)})
    if is_tied(lm):
        from deepspeed.pipe import TiedLayerSpec

        first = TiedLayerSpec(TIED_KEY, Embed, embedding, tied_weight_attr=["embedding.weight"])
        last = TiedLayerSpec(TIED_KEY, Embed, embedding, forward_fn=tied_head, tied_weight_attr=["embedding.weight"])
        return [first, enter, *blocks, exit_, last]
    return [Embed(embedding), enter, *blocks, exit_, Head(lm.get_submodule(st.head))]


def run_layers(layers: list, x: torch.Tensor) -> torch.Tensor:
    """The layers in sequence on one process (tests): a TiedLayerSpec as DeepSpeed would build it."""
    built = {}
    for layer in layers:
        if hasattr(layer, "key"):  # TiedLayerSpec
            module = built.setdefault(layer.key, layer.build())
            x = layer.forward_fn(module, x) if layer.forward_fn is not None else module(x)
        else:
            x = layer(x)
    return x


def boundaries(blocks: list[int]) -> list[int]:
    """DeepSpeed's `parts` for [Embed, Enter, blocks..., Exit, Head]: embedding and Enter join the
    first stage, Exit and the head the last, the blocks split as the plan says (blocks per stage,
    memory-balanced by launcher/memory/estimate.stage_split)."""
    parts, at = [0], 2
    for n in blocks:
        at += n
        parts.append(at)
    parts[-1] = sum(blocks) + 4
    return parts


def pipeline_module(model, blocks: list[int], tp: int = 1):
    """The model as a deepspeed.pipe.PipelineModule of len(blocks) stages (this rank builds only
    its own stage's layers into it; the rest stay in `model`, on the meta device). With tp > 1 the
    topology is pipe x data x model (a TP group is `tp` consecutive ranks) and this rank's layers
    are cut to its TP shard (launcher/parallel/tensor.py)."""
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layers = stage_layers(model)
    parts = boundaries(blocks)
    pp = len(blocks)
    topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dist.get_world_size() // (pp * tp))

    class Split(PipelineModule):
        def _partition_layers(self, method="uniform"):
            self.parts = list(parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=parts[stage], stop=parts[stage + 1])

    module = Split(layers, topology=topology, loss_fn=causal_lm_loss, partition_method="uniform", dynamic_shape=True)
    if tp > 1:
        _split_tensor_parallel(module, causal_lm(model).config)
    return module


def _split_tensor_parallel(module, config) -> None:
    """Cut this rank's blocks, embedding and LM head to its TP shard; the loss becomes the
    vocabulary-parallel cross-entropy."""
    from launcher.parallel import tensor

    grid = module.mpu()
    tp = tensor.Group(grid.get_slice_parallel_rank(), grid.get_slice_parallel_world_size(),
                      grid.get_slice_parallel_group())
    for layer in list(module.modules()):
        if isinstance(layer, Block):
            tensor.shard_block(layer.layer, config.model_type, tp)
            layer.heads = tp.part(config.num_attention_heads)
        elif isinstance(layer, Embed):
            layer.vocab = tensor.shard_embedding(layer.embedding, tp)
        elif isinstance(layer, Head):
            layer.vocab = tensor.shard_head(layer.lm_head, tp)
    module.loss_fn = tensor.vocab_parallel_loss(tp, IGNORE)

