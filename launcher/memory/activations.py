"""Activations saved for backward, per transformer block and per micro-batch (what lies outside
the blocks, the logits and the loss: launcher/memory/edges.py).

The structure follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"), whose 34·sbh + 5·as²b bytes per layer is the GPT-style special case; here
every tensor autograd keeps is counted from the architecture as transformers implements it
(verified against saved-tensor measurements in tests/test_memory_activations.py):

  norms        HF RMSNorm upcasts to fp32: keeps the fp32 input and the normalised 16-bit
               tensor (6 bytes/element in 16-bit); LayerNorm keeps its input + mean/rstd.
  linear inputs  one tensor per distinct input, kept only if a consuming linear has a trainable
               weight or a LoRA adapter (a frozen linear needs no input for its backward).
  attention    sdpa/flash: q, k, v (after RoPE, K/V at the KV width: GQA stays unexpanded),
               the output and the fp32 log-sum-exp; eager: q and K expanded to all heads, fp32
               softmax output + its 16-bit copy (the s² terms), V expanded; then the
               contiguous output o_proj reads. Packed rows under sdpa (--packing): K/V expanded to
               every head and the float bias of the block-diagonal mask (b·s² per layer). sdpa's math kernel (falcon-7b's multi-query
               layout, `sdpa_math_kernel`): fp32 copies of q, K, V and the fp32 softmax.
  MLP          gated SiLU: gate, SiLU(gate), up, product (4 × s·b·ffn); GELU: 2; ReLU: 1;
               GELU written as tanh formula (gpt2/phi "gelu_new"): 5. MoE: per routed token.
  dropout      a 1-byte mask per element where the config's dropout > 0.

Tensor parallelism (DeepSpeed AutoTP): norms and the inputs of column-parallel linears stay
whole, everything between a column- and a row-parallel linear is split by tp.
Recompute (`stored_per_layer`): `full` keeps each block's input; `selective` is per-op selective
checkpointing (PyTorch's SAC policy as torchtitan uses it): the block input, the outputs of every
other matmul (`saved_matmul_outputs`) and the attention output + LSE are kept, element-wise ops
(norms, activation functions, RoPE) are recomputed. Both add ONE block's full working set while that
block is recomputed in backward.
Compiled blocks (--compile) are counted as eager: inductor's partitioner recomputes element-wise
ops in backward instead of saving their outputs, so they save less (~29 % on a tiny Llama,
tests/test_compile.py checks the bound); the plan is an upper bound for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.memory.attention import attention_impl, masked_sdpa, unfused_attention
from launcher.memory.memo import ArchMemo
from launcher.memory.states import bare_parameter, fused_experts, lora_targets
from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec

# Elements kept by the MLP activation function, in units of s·b·ffn (including the tensor the
# down projection reads).
_ACT_SAVED = {"silu": 4, "gelu": 2, "relu": 1, "gelu_new": 5, "bloom_gelu": 2}
_ACT_ALIASES = {
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu_new",
    "quick_gelu": "gelu_new",
    "gelu_accurate": "gelu_new",
}
# Eager attention whose softmax runs in the compute dtype; the others upcast it to fp32.
_EAGER_SOFTMAX_IN_DTYPE = {"gpt2", "falcon"}


def _softmax_bytes(arch: ModelArch, e: int) -> int:
    """Bytes per score of eager attention's softmax output (and of each gradient through it)."""
    return e if arch.model_type in _EAGER_SOFTMAX_IN_DTYPE else 4


def _eager_value_input(arch: ModelArch, e: int) -> int:
    """Bytes per score of the tensor eager attention's value matmul reads and keeps, when that is
    not the softmax output itself: the dropout output, or else the 16-bit copy of fp32 probs."""
    if dropout_rate(arch, "attention_dropout", "attn_pdrop") > 0:
        return e
    return e if _softmax_bytes(arch, e) == 4 and e == 2 else 0


def activation_fn(arch: ModelArch) -> str:
    cfg = arch.hf_config
    if arch.model_type == "bloom":
        return "bloom_gelu"
    act = cfg.get("hidden_act") or cfg.get("activation_function") or cfg.get("activation")
    if arch.gated_mlp:
        return "silu"
    if not isinstance(act, str):  # absent, or a config.json value of another type
        return "gelu"
    act = _ACT_ALIASES.get(act, act)
    return act if act in _ACT_SAVED else "gelu"


def dropout_rate(arch: ModelArch, *keys: str) -> float:
    for k in keys:
        v = arch.hf_config.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1:
            return float(v)
    return 0.0


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one block keeps for backward, for one micro-batch on one GPU."""

    norms: float
    linear_inputs: float
    attention: float
    attention_scores: float  # the s² terms (eager and sdpa's math kernel)
    mlp: float
    dropout: float

    @property
    def total(self) -> float:
        return (
            self.norms + self.linear_inputs + self.attention + self.attention_scores + self.mlp + self.dropout
        )


def _n_norms(arch: ModelArch) -> int:
    per = arch.hidden * (2 if arch.norm == "layernorm" else 1)
    return max(1, round(arch.layer_norm_params / per)) if per else 1


def norm_bytes(arch: ModelArch, tokens: float, e: int, trainable: bool, width: float | None = None) -> float:
    """What one norm over `tokens` rows keeps for backward.

    HF RMSNorm: x.float() -> x * rsqrt(mean(x²) + eps) -> .to(dtype) * weight. pow/mul keep the
    fp32 input and rsqrt; the weight multiply keeps the normalised tensor only when the weight
    trains (not under LoRA). LayerNorm keeps its input and the fp32 mean/rstd.
    """
    h = arch.hidden if width is None else width
    if arch.norm == "rmsnorm":
        return tokens * h * 4 + 4 * tokens + (tokens * h * e if trainable else 0)
    return tokens * h * e + 8 * tokens


# Families whose attention normalises every query and key head (RMSNorm over head_dim) before RoPE.
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}


_MEMO = ArchMemo()


def layer_activations(arch: ModelArch, spec: TrainSpec, targets: set[str]) -> LayerActivations:
    """What one block keeps for backward (memoised per arch on the fields it reads)."""
    key = (
        spec.precision,
        spec.tp,
        spec.micro_batch,
        spec.seq_len,
        spec.method,
        spec.attention,
        spec.packing,
        spec.lora_r,
        frozenset(targets),
    )
    return _MEMO.get(arch, key, lambda: _layer_activations(arch, spec, targets))


def _layer_activations(arch: ModelArch, spec: TrainSpec, targets: set[str]) -> LayerActivations:
    e = 4 if spec.precision == "fp32" else 2
    t = spec.tp
    b, s = spec.micro_batch, spec.seq_len
    T = b * s
    h, f = arch.hidden, arch.ffn
    qd = arch.heads * arch.head_dim
    kvd = arch.kv_dim
    heads = arch.heads / t

    def keeps(role: str) -> bool:
        lins = [lin for lin in arch.linears if lin.role == role]
        return any(spec.method == "full" or lin.name in targets for lin in lins)

    n_norms = _n_norms(arch)
    norms = n_norms * norm_bytes(arch, T, e, spec.method == "full")
    if arch.model_type in _QK_NORM:
        rows = T * (arch.heads + arch.kv_heads) / spec.tp
        norms += norm_bytes(arch, rows, e, spec.method == "full", width=arch.head_dim)

    linear_inputs = 0.0
    impl = attention_impl(arch, spec)
    if spec.precision == "bf16-autocast" and spec.trains_adapters:
        # PEFT casts each adapter's input to its fp32 weights and autocast casts it back to bf16 for
        # the matmul: every adapted linear keeps its own bf16 copy of its input (none is shared).
        # The down projection's copy replaces the MLP product it would otherwise keep (in `act`).
        for lin in arch.linears:
            if lin.name in targets and lin.role in ("qkv", "attn_out", "mlp_in") and not bare_parameter(arch, lin):
                linear_inputs += lin.count * T * lin.fan_in * 2
    else:
        if keeps("qkv"):
            linear_inputs += T * h * e
        if keeps("attn_out") and unfused_attention(arch, spec):
            # fused sdpa/flash return (b, s, heads, d) memory: o_proj reads a view of the kept output
            linear_inputs += T * qd / t * e
        shared_norm = n_norms == 1 and arch.model_type != "gpt2"  # parallel block: MLP reads the same tensor
        if (keeps("mlp_in") or keeps("router")) and not (shared_norm and keeps("qkv")):
            linear_inputs += T * h * e

    scores = 0.0
    if impl == "eager":
        # q, K and V expanded to every query head; the softmax output (fp32 in most families),
        # the dropout mask (1 byte, CUDA's fused kernel) and the tensor the value matmul reads
        attention = 3 * T * qd / t * e
        mask = 1 if dropout_rate(arch, "attention_dropout", "attn_pdrop") > 0 else 0
        # gemma2 soft-caps the scores (cap * tanh(scores / cap)): tanh keeps its output
        cap = e if arch.hf_config.get("attn_logit_softcapping") else 0
        scores = b * heads * s * s * (_softmax_bytes(arch, e) + mask + _eager_value_input(arch, e) + cap)
    elif impl == "math":
        # sdpa's math kernel works in fp32 (torch >= 2.5 upcasts 16-bit inputs) and keeps the
        # scaled q, K and V and the softmax output. K/V keep their own width with one sequence
        # per micro-batch; with more, matmul's broadcasting copies them out to every head.
        kv_width = kvd if b == 1 else qd
        attention = 4 * T * (qd + 2 * kv_width) / t
        scores = 4 * b * heads * s * s
    elif masked_sdpa(arch, spec):
        # packed rows reach sdpa with transformers' block-diagonal boolean mask: sdpa turns it into
        # a float bias in the compute dtype that the masked kernel (memory-efficient on CUDA)
        # keeps per layer, and with a mask transformers repeats K/V to every query head
        # (use_gqa_in_sdpa). flash-attn's variable-length kernel needs neither.
        attention = 3 * T * qd / t * e + T * qd / t * e + 4 * b * heads * s
        scores = b * s * s * e
    else:
        attention = T * (qd + 2 * kvd) / t * e + T * qd / t * e + 4 * b * heads * s

    k = arch.experts_per_token if arch.experts > 1 else 1
    act = _ACT_SAVED[activation_fn(arch)]
    if not keeps("mlp_out"):
        act -= 1  # the down projection's input is not kept
    mlp = act * T * k * f / t * e
    if arch.experts > 1:
        # gathered expert inputs, expert outputs before weighting, router logits (fp32)
        mlp += 2 * T * k * h * e + T * arch.experts * 4 * 2

    for lin in arch.linears if spec.trains_adapters else ():
        if lin.name not in targets:
            continue
        if bare_parameter(arch, lin):
            # the merged weight W + B @ A of every expert (or the router), kept by the matmuls
            linear_inputs += lin.count * lin.fan_in * lin.fan_out / t * e
        else:
            # lora_A's output (r values per token) for lora_B's gradient
            linear_inputs += lin.count * T * spec.lora_r * e

    p_resid = dropout_rate(arch, "resid_pdrop", "hidden_dropout", "dropout")
    dropout = 2 * T * h * 1 if p_resid > 0 else 0.0

    return LayerActivations(norms, linear_inputs, attention, scores, mlp, dropout)


def checkpoint_input_bytes(arch: ModelArch, spec: TrainSpec) -> float:
    """What full recompute keeps per block: its input hidden states."""
    e = 4 if spec.precision == "fp32" else 2
    return spec.micro_batch * spec.seq_len * arch.hidden * e


def stored_per_layer(
    arch: ModelArch, spec: TrainSpec, layer: LayerActivations, targets: frozenset | set = frozenset()
) -> float:
    """Bytes each block keeps between its forward and its backward under the recompute mode."""
    if spec.grad_ckpt == "none":
        return layer.total
    kept = checkpoint_input_bytes(arch, spec)
    if spec.grad_ckpt == "selective":
        e = 4 if spec.precision == "fp32" else 2
        T = spec.micro_batch * spec.seq_len
        heads = arch.heads / spec.tp
        kept += T * e * saved_matmul_outputs(arch, spec, targets)
        if not unfused_attention(arch, spec):
            # the fused attention op's output and LSE (the policy saves it: sdpa's kernels and
            # flash-attn's op); eager and the math kernel are bmm and softmax, recomputed
            kept += T * arch.heads * arch.head_dim / spec.tp * e + 4 * spec.micro_batch * heads * spec.seq_len
    return kept


def selective_is_full(arch: ModelArch, spec: TrainSpec, targets: frozenset | set) -> bool:
    """Selective checkpointing would keep nothing full recompute does not (every matmul biased,
    as in BLOOM, and unfused attention): the same memory and the same recompute."""
    return saved_matmul_outputs(arch, spec, targets) == 0 and unfused_attention(arch, spec)


def saved_matmul_outputs(arch: ModelArch, spec: TrainSpec, targets: frozenset | set) -> float:
    """Elements per token of the matmul outputs selective checkpointing keeps in one block."""
    return sum(out for kept, out, _ in selective_matmuls(arch, spec, targets) if kept)


def selective_matmuls(
    arch: ModelArch, spec: TrainSpec, targets: frozenset | set
) -> list[tuple[bool, float, float]]:
    """(kept, outputs per token, multiply-adds per token) of each matmul of one block, in order.

    The policy (launcher/train/model.py) keeps every other aten.mm of a block, counting from
    the first, afresh for each block. A linear without bias is one mm; with a bias it is an
    addmm, which the policy does not count (always recomputed). A LoRA-adapted linear adds two
    mms after its base one: lora_A (r outputs) and lora_B (the linear's outputs). Fused expert
    weights (transformers >= 5) run grouped matmuls, which the policy does not keep, and PEFT
    adapts them (and the router) through the weight, with no per-token matmul of its own.
    """
    out: list[tuple[bool, float, float]] = []
    count = 0
    for lin in arch.linears:
        width = lin.fan_out / spec.tp if lin.parallel == "column" else lin.fan_out
        fan_in = lin.fan_in / spec.tp if lin.parallel == "row" else lin.fan_in
        fused = fused_experts(arch, lin)
        k = arch.experts_per_token if fused else 1
        is_mm = not fused and not lin.bias and arch.model_type != "gpt2"  # GPT-2: Conv1D, addmm
        if is_mm:
            count += 1
        out.append((is_mm and count % 2 == 1, k * width, k * fan_in * width))
        if lin.name in targets and not bare_parameter(arch, lin):
            for w, macs in ((spec.lora_r, fan_in * spec.lora_r), (width, spec.lora_r * width)):
                count += 1
                out.append((count % 2 == 1, k * w, k * macs))
    return out


def parallel_block(arch: ModelArch) -> bool:
    """Attention and MLP read the same input and add into one residual (GPT-J style): their
    backwards are not ordered, so neither branch's saved tensors are known to be freed first."""
    cfg = arch.hf_config
    return {
        "falcon": cfg.get("parallel_attn", True),
        "phi": True,
        "gpt_neox": cfg.get("use_parallel_residual", True),
        "stablelm": cfg.get("use_parallel_residual", False),
    }.get(arch.model_type, False)


def backward_transient(arch: ModelArch, spec: TrainSpec, layer: LayerActivations) -> float:
    """Bytes a block's backward adds for a moment beyond what it saved: the MLP's two input-sized
    gradients (below), or, if larger, the attention's. Unfused attention holds
    the gradients of the probabilities and of the scores together, in the softmax's dtype
    (fp32 for sdpa's math kernel; measured: two score-sized tensors). By then a sequential
    block's MLP backward has freed what the MLP saved, and the value matmul's backward what it
    read (eager's dropout output or 16-bit copy of the probabilities). The fused kernels work in
    tiles (nothing s²-sized). Mixture-of-experts blocks add the full gradient of a fused expert
    weight (_expert_weight_gradient); the larger of the two counts."""
    impl = attention_impl(arch, spec)
    e = 4 if spec.precision == "fp32" else 2
    scores = spec.micro_batch * (arch.heads / spec.tp) * spec.seq_len**2
    freed = 0.0 if parallel_block(arch) else layer.mlp
    attention = 0.0
    if impl == "eager":
        freed += scores * _eager_value_input(arch, e)
        attention = max(0.0, 2 * _softmax_bytes(arch, e) * scores - freed)
    elif impl == "math":
        attention = max(0.0, 2 * 4 * scores - freed)
    # earlier, in the MLP's backward while all it saved is alive: the gradients of the down
    # projection's input and through the activation function (measured in pipeline stages, whose
    # peak is there: no logits on the stage)
    k = arch.experts_per_token if arch.experts > 1 else 1
    mlp = 2 * spec.micro_batch * spec.seq_len * k * arch.ffn / spec.tp * e
    return max(attention, mlp, _expert_weight_gradient(arch, spec) * e / spec.tp)


def _expert_weight_gradient(arch: ModelArch, spec: TrainSpec) -> float:
    """Elements of the largest fused expert weight's full gradient, alive for a moment in the
    experts' backward: under ZeRO-2/3 before it is reduced into the partition (ZeRO-0/1 count
    every gradient anyway); under LoRA the gradient of the merged weight W + B @ A."""
    if arch.experts <= 1 or (spec.method == "full" and spec.zero_stage < 2):
        return 0.0
    targets = lora_targets(arch, spec) if spec.trains_adapters else set()
    return max(
        (
            lin.count * lin.fan_in * lin.fan_out
            for lin in arch.linears
            if fused_experts(arch, lin) and (spec.method == "full" or lin.name in targets)
        ),
        default=0.0,
    )


def first_block_backward(arch: ModelArch, spec: TrainSpec, layer: LayerActivations, targets) -> float:
    """Activation bytes while the first block runs its backward: what it saved (or kept and then
    recomputed) and its backward's transient."""
    kept = 0.0 if spec.grad_ckpt == "none" else stored_per_layer(arch, spec, layer, targets)
    return kept + layer.total + backward_transient(arch, spec, layer)


def recompute_working_set(spec: TrainSpec, layer: LayerActivations) -> float:
    """One block's full activations, alive while that block is recomputed in backward."""
    return 0.0 if spec.grad_ckpt == "none" else layer.total
