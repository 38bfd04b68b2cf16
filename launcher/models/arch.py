"""What a decoder-only model is, in the numbers the memory model and the planner need.

A `ModelArch` is built from a Hugging Face config (the catalog stores config.json contents;
users may pass their own), never from weights. Parameter counts are exact: each linear,
norm and embedding of the real module tree is listed, so counts agree with
`sum(p.numel())` of the transformers model (checked in tests/test_models.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Parallel = Literal["column", "row", "replicated"]


@dataclass(frozen=True)
class Linear:
    """One linear layer inside a transformer block (or `count` identical ones, e.g. experts).

    `name` is the leaf module name in the Hugging Face model (q_proj, query_key_value, w1, ...),
    the name LoRA `target_modules` match against. `parallel` says how tensor parallelism splits
    it: column-parallel (output dim split), row-parallel (input dim split) or replicated.
    `role` groups linears for the activation model: qkv, attn_out, mlp_in, mlp_out, router.
    """

    name: str
    fan_in: int
    fan_out: int
    bias: bool
    parallel: Parallel
    role: Literal["qkv", "attn_out", "mlp_in", "mlp_out", "router"]
    count: int = 1

    @property
    def weight_params(self) -> int:
        return self.count * self.fan_in * self.fan_out

    @property
    def params(self) -> int:
        return self.count * (self.fan_in * self.fan_out + (self.fan_out if self.bias else 0))


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer described by its config numbers.

    Parameter groups (all exact counts):
      embedding_params   token embeddings + learned positions + embedding layernorm (bloom)
      layer linears      per block, see `linears`
      layer_norm_params  per block: the norms' weights (and biases for LayerNorm)
      final_norm_params  the norm before the LM head
      lm_head_params     0 when tied to the embeddings
    """

    name: str
    model_type: str  # Hugging Face model_type (llama, bloom, mixtral, ...)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # intermediate size of one MLP (one expert for MoE)
    gated_mlp: bool  # SwiGLU/GeGLU: gate, up and down projections
    vocab: int
    tied_embeddings: bool
    norm: Literal["layernorm", "rmsnorm"]
    linears: tuple[Linear, ...]
    layer_norm_params: int
    embedding_params: int
    final_norm_params: int
    lm_head_params: int
    experts: int = 1
    experts_per_token: int = 1
    max_positions: int = 0
    embed_dim: int = 0  # width of the token embedding matrix when it is not `hidden` (OPT-350M: 512)
    hf_config: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- parameter counts -------------------------------------------------------------
    @property
    def embed_matrix_params(self) -> int:
        """The token embedding matrix alone (what a tied LM head shares)."""
        return self.vocab * (self.embed_dim or self.hidden)

    @property
    def linear_params_per_layer(self) -> int:
        return sum(lin.params for lin in self.linears)

    @property
    def params_per_layer(self) -> int:
        return self.linear_params_per_layer + self.layer_norm_params

    @property
    def total_params(self) -> int:
        return (
            self.embedding_params
            + self.layers * self.params_per_layer
            + self.final_norm_params
            + self.lm_head_params
        )

    @property
    def active_params_per_token(self) -> int:
        """Parameters touched per token (MoE: only the routed experts); drives FLOPs."""
        per_layer = self.layer_norm_params
        for lin in self.linears:
            n = lin.params // lin.count
            per_layer += n * (
                self.experts_per_token if lin.count == self.experts and self.experts > 1 else lin.count
            )
        return self.embedding_params + self.layers * per_layer + self.final_norm_params + self.lm_head_params

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def largest_layer_params(self) -> int:
        """Largest single parameter-holding module ZeRO-3 must gather at once."""
        return max(self.params_per_layer, self.vocab * self.hidden)

    def linear_names(self) -> list[str]:
        return [lin.name for lin in self.linears]
