"""Stage adapters: a Hugging Face causal LM as the flat list of layers DeepSpeed's pipeline engine
runs (embedding, one layer per decoder block, final norm + LM head), and the loss on the last
stage.

The layers wrap the model's own modules (no copy), so a LoRA model's adapters train inside the
stages and the export reads the trained weights back by their Hugging Face names. Between stages
only the hidden states travel: every block derives the positions (0..s-1), the causal mask and
its rotary embedding from the sequence itself, as the model's forward does when it is given no
attention mask (launcher/train/data.py pads on the right and passes none).
"""

from __future__ import annotations

import torch
from torch import nn

from launcher.parallel.split import pipeline_refusal

IGNORE = -100


class Embed(nn.Module):
    def __init__(self, embed_tokens: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class Block(nn.Module):
    """One decoder layer with what the model's forward would hand it."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, config, sliding: bool) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self.config, self.sliding = config, sliding

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        make_mask = create_sliding_window_causal_mask if self.sliding else create_causal_mask
        mask = make_mask(
            config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=positions
        )
        rotary = self.rotary(hidden, position_ids=positions)
        return self.layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)


class Head(nn.Module):
    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


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
    return getattr(config, "sliding_window", None) is not None


def causal_lm(model) -> nn.Module:
    """The transformers causal LM inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def stage_layers(model) -> list[nn.Module]:
    """[Embed, Block x layers, Head] for a model whose family has an adapter."""
    lm = causal_lm(model)
    config = lm.config
    why = pipeline_refusal(config.model_type, bool(getattr(config, "tie_word_embeddings", False)), config.model_type)
    if why is not None:
        raise ValueError(why)  # the planner refuses these before any rank starts
    inner = lm.model
    blocks = [Block(layer, inner.rotary_emb, config, _sliding(config, i)) for i, layer in enumerate(inner.layers)]
    return [Embed(inner.embed_tokens), *blocks, Head(inner.norm, lm.lm_head)]


def boundaries(blocks: list[int]) -> list[int]:
    """DeepSpeed's `parts` for [Embed, blocks..., Head]: the embedding joins the first stage and
    the head the last, the blocks split as the plan says (blocks per stage, memory-balanced by
    launcher/memory/estimate.stage_split)."""
    parts, at = [0], 1
    for n in blocks:
        at += n
        parts.append(at)
    parts[-1] = sum(blocks) + 2
    return parts


def pipeline_module(model, blocks: list[int]):
    """The model as a deepspeed.pipe.PipelineModule of len(blocks) stages (this rank builds only
    its own stage's layers into it; the rest stay in `model`, on the meta device)."""
    from deepspeed.pipe import PipelineModule

    layers = stage_layers(model)
    parts = boundaries(blocks)
    pp = len(blocks)

    class Split(PipelineModule):
        def _partition_layers(self, method="uniform"):
            self.parts = list(parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=parts[stage], stop=parts[stage + 1])

    return Split(layers, num_stages=pp, loss_fn=causal_lm_loss, partition_method="uniform", dynamic_shape=True)
