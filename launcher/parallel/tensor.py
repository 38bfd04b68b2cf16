"""Megatron-style tensor parallelism inside pipeline stages (TP x PP x DP on DeepSpeed's pipeline
engine), on the TP groups of its topology's `model` axis.

Each block's attention heads and MLP columns are split over the TP group: the linears that read
the sub-layer's input are column-parallel (this rank's output rows), the ones that write its
output are row-parallel (this rank's input columns, one all-reduce of the partial sums before the
bias). The sub-layer's input enters the TP region once (identity forward, one all-reduce of its
gradient backward), so a block costs two all-reduces forward and two backward, as in Megatron.
The embedding and the LM head are split by vocabulary (a tied head shares the split embedding) and
the loss is the vocabulary-parallel cross-entropy: no rank ever holds the whole logits.

The layers stay the model's own modules under their Hugging Face names, each parameter cut to its
shard in place; a sharded parameter carries `tp_dim` (the dimension it was cut along, for the
export) and `model_parallel` (DeepSpeed counts it once per TP rank in the gradient norm).
Everything else (norms, row-parallel biases) is replicated and receives identical gradients on
every TP rank, so no extra synchronisation is needed.

Families: the rotary decoders with separate q/k/v/o and gate/up/down projections, and BLOOM (fused
query_key_value laid out per head, ALiBi slopes split with the heads). KV heads must divide by tp
(tensor_parallel_refusal): Megatron's replication of fewer KV heads than ranks is not built.
"""

from __future__ import annotations

import torch
from torch import nn


class _Enter(torch.autograd.Function):
    """Into the TP region: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _Sum(torch.autograd.Function):
    """Out of the TP region: all-reduce of the partial results forward, identity backward (every
    rank then computes the same function of the sum, so the gradient is already the same)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Share(torch.autograd.Function):
    """Identity forward, the gradient divided by the group's size backward: for a computation every
    rank repeats inside the TP region, whose input gradient the region's entry then sums over the
    group (it must count once, not once per rank)."""

    @staticmethod
    def forward(ctx, x, size):
        ctx.size = size
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.size, None


class Group:
    """This rank's TP group: `rank` of `size`, and the process group."""

    def __init__(self, rank: int, size: int, group) -> None:
        self.rank, self.size, self.group = rank, size, group

    def part(self, n: int) -> slice:
        step = n // self.size
        return slice(self.rank * step, (self.rank + 1) * step)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return _Enter.apply(x, self.group)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return _Sum.apply(x, self.group)

    def share(self, x: torch.Tensor) -> torch.Tensor:
        return _Share.apply(x, self.size)


def _cut(param: nn.Parameter, dim: int, part: slice) -> nn.Parameter:
    shard = nn.Parameter(param.detach().narrow(dim, part.start, part.stop - part.start).clone(),
                         requires_grad=param.requires_grad)
    shard.tp_dim = dim
    shard.model_parallel = True
    return shard


class RowParallel(nn.Module):
    """Wraps a linear cut along its input: partial products summed over the TP group, then the
    (replicated) bias."""

    def __init__(self, linear: nn.Linear, tp: Group) -> None:
        super().__init__()
        linear.weight = _cut(linear.weight, 1, tp.part(linear.in_features))
        self.weight, self.bias, self.tp = linear.weight, linear.bias, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.sum(nn.functional.linear(x, self.weight))
        return out + self.bias if self.bias is not None else out


def _column(linear: nn.Linear, tp: Group) -> None:
    """Cut a linear along its output in place (its input has entered the TP region already)."""
    part = tp.part(linear.out_features)
    linear.weight = _cut(linear.weight, 0, part)
    if linear.bias is not None:
        linear.bias = _cut(linear.bias, 0, part)
    linear.out_features = part.stop - part.start


def _column_parallel(parent: nn.Module, name: str, tp: Group) -> None:
    """A projection that reads the sub-layer's input, cut along its output. Its LoRA adapters
    (PEFT wraps the base linear) split the same way: lora_B cut like the base's output rows, lora_A
    whole (every rank repeats it). lora_A's output enters the TP region on its way into lora_B (each
    rank's rows give part of its gradient, summed there), and the gradient lora_A sends back to the
    sub-layer's input, complete on every rank, is shared out (1/tp each) before the sub-layer's own
    entry sums it over the group."""
    module = getattr(parent, name)
    _column(getattr(module, "base_layer", module), tp)
    for lora_a in getattr(module, "lora_A", {}).values():
        lora_a.register_forward_pre_hook(lambda _m, args: (tp.share(args[0]), *args[1:]))
    for lora_b in getattr(module, "lora_B", {}).values():
        _column(lora_b, tp)
        lora_b.register_forward_pre_hook(lambda _m, args: (tp.enter(args[0]), *args[1:]))


def _row_parallel(parent: nn.Module, name: str, tp: Group) -> None:
    """A projection that writes the sub-layer's output, cut along its input. Its LoRA adapters:
    lora_A cut like the base's input columns, its partial products summed over the group before
    lora_B (whole), so the adapter adds the same full output on every rank."""
    module = getattr(parent, name)
    if not hasattr(module, "base_layer"):
        setattr(parent, name, RowParallel(module, tp))
        return
    module.base_layer = RowParallel(module.base_layer, tp)
    for lora_a in module.lora_A.values():
        lora_a.weight = _cut(lora_a.weight, 1, tp.part(lora_a.in_features))
        lora_a.in_features = lora_a.weight.shape[1]
        lora_a.register_forward_hook(lambda _m, _args, out: tp.sum(out))


def _enter_on_input(module: nn.Module, tp: Group) -> None:
    """The sub-layer's hidden-state input (first positional or `hidden_states`) enters the TP
    region once, whatever number of column-parallel linears read it."""

    def hook(_module, args, kwargs):
        if args:
            return (tp.enter(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": tp.enter(kwargs["hidden_states"])}

    module.register_forward_pre_hook(hook, with_kwargs=True)


def shard_block(layer: nn.Module, model_type: str, tp: Group) -> None:
    """Split one decoder layer's heads and MLP over the TP group, in place."""
    if model_type == "bloom":
        attn, mlp = layer.self_attention, layer.mlp
        _column_parallel(attn, "query_key_value", tp)  # rows laid out (head, q/k/v, head_dim): a head range
        _row_parallel(attn, "dense", tp)
        attn.num_heads //= tp.size
        _column_parallel(mlp, "dense_h_to_4h", tp)
        _row_parallel(mlp, "dense_4h_to_h", tp)
    else:
        attn, mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj"):
            _column_parallel(attn, name, tp)
        _row_parallel(attn, "o_proj", tp)
        for name in ("gate_proj", "up_proj"):
            _column_parallel(mlp, name, tp)
        _row_parallel(mlp, "down_proj", tp)
    _enter_on_input(attn, tp)
    _enter_on_input(mlp, tp)


class VocabParallel:
    """The embedding matrix cut by vocabulary rows: the lookup of ids this rank holds (others
    zero) summed over the group; as the LM head, this rank's logits columns."""

    def __init__(self, rows: int, tp: Group) -> None:
        self.part, self.tp = tp.part(rows), tp

    def lookup(self, embedding: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.part.start) | (ids >= self.part.stop)
        local = (ids - self.part.start).masked_fill(outside, 0)
        out = nn.functional.embedding(local, embedding.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.sum(out)

    def logits(self, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.tp.enter(hidden), weight)


def shard_embedding(embedding: nn.Embedding, tp: Group) -> VocabParallel:
    vocab = VocabParallel(embedding.num_embeddings, tp)
    embedding.weight = _cut(embedding.weight, 0, vocab.part)
    embedding.num_embeddings = vocab.part.stop - vocab.part.start
    return vocab


def shard_head(head: nn.Linear, tp: Group) -> VocabParallel:
    vocab = VocabParallel(head.out_features, tp)
    _column(head, tp)
    return vocab


def vocab_parallel_loss(tp: Group, ignore: int):
    """Next-token cross-entropy over logits split by vocabulary (this rank's columns
    `tp.part(V)`), in fp32, mean over the labelled tokens: the value and gradients of the loss
    over the whole vocabulary, with only [tokens, V/tp] logits on each rank."""

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        local = logits.float().reshape(-1, logits.shape[-1])
        target = nn.functional.pad(labels, (0, 1), value=ignore)[..., 1:].reshape(-1)
        width = local.shape[-1]
        start = tp.rank * width
        top = local.detach().max(dim=-1).values
        torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX, group=tp.group)
        shifted = local - top.unsqueeze(-1)
        total = tp.sum(shifted.exp().sum(dim=-1))
        mine = (target >= start) & (target < start + width)
        index = (target - start).clamp(0, width - 1).unsqueeze(-1)
        picked = tp.sum(shifted.gather(-1, index).squeeze(-1).masked_fill(~mine, 0.0))
        labelled = target != ignore
        per_token = (total.log() - picked).masked_fill(~labelled, 0.0)
        return per_token.sum() / labelled.sum().clamp(min=1)

    return loss
