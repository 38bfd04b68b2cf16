"""QLoRA's frozen base: the blocks' linear layers quantised in place with bitsandbytes.

One path for every model the worker builds under QLoRA -- a whole model or one pipeline stage,
random init or pretrained weights -- so every layout quantises the same 16-bit values the same
way (a pp 2 run and a pp 1 run start from identical 4-bit weights):

- nf4: bitsandbytes' Linear4bit, NF4 with double-quantised constants, the 4-bit values packed
  into the compute dtype's storage (as FSDP-QLoRA stores them, so a sharding engine sees one
  ordinary 16-bit tensor);
- int8: bitsandbytes' Linear8bitLt (LLM.int8(), transformers' default outlier threshold).

What stays in the compute dtype (launcher/memory/states.py counts the same): embeddings, the LM
head, norms, biases, routers, and fused expert tensors (not nn.Linear). Only materialised layers
are touched: a pipeline stage's other modules stay on the meta device.

bitsandbytes >= 0.48 runs both formats forward and backward on the CPU (its CPU backend), so
QLoRA trains on a CPU box as on a GPU.
"""

from __future__ import annotations

import contextlib

from launcher.errors import FtlaunchError

MIN_BITSANDBYTES = (0, 48)
INT8_THRESHOLD = 6.0  # LLM.int8()'s outlier threshold, bitsandbytes' and transformers' default


class QuantizeError(FtlaunchError):
    pass


def bitsandbytes_refusal(what: str) -> str | None:
    """Why `what` (QLoRA, 8-bit AdamW) cannot run in this environment, or None."""
    try:
        import bitsandbytes
    except ImportError:
        return f"{what} needs bitsandbytes: pip install 'bitsandbytes>=0.48' (it runs on the CPU too)"
    except Exception as exc:  # noqa: BLE001 - a broken native library raises anything
        return f"bitsandbytes does not load here ({str(exc).splitlines()[0]}); reinstall it"
    version = tuple(int(x) for x in bitsandbytes.__version__.split(".")[:2] if x.isdigit())
    if version < MIN_BITSANDBYTES:
        return (
            f"{what}: bitsandbytes {bitsandbytes.__version__} has no CPU backend; "
            f"pip install 'bitsandbytes>={'.'.join(map(str, MIN_BITSANDBYTES))}'"
        )
    return None


def quantize_linears(model, quant: str, dtype, keep: set[int]) -> int:
    """Replace every materialised nn.Linear of `model` whose id is not in `keep` (the LM head)
    by its bitsandbytes counterpart holding the same weights quantised; returns how many."""
    import bitsandbytes as bnb
    import torch

    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Linear and id(child) not in keep and not child.weight.is_meta:
                swaps.append((parent, name, child))
    for parent, name, lin in swaps:
        setattr(parent, name, _quantized(bnb, lin, quant, dtype))
    return len(swaps)


def _quantized(bnb, lin, quant: str, dtype):
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    device = lin.weight.device
    bias = lin.bias is not None
    weight = lin.weight.data.to(dtype)
    fake = isinstance(weight, FakeTensor)
    with unset_fake_temporarily() if fake else contextlib.nullcontext():  # see _fake_quantized
        if quant == "nf4":
            q = bnb.nn.Linear4bit(
                lin.in_features, lin.out_features, bias=bias, compute_dtype=dtype, quant_type="nf4",
                compress_statistics=True, quant_storage=dtype, device="meta",
            )
        else:
            q = bnb.nn.Linear8bitLt(
                lin.in_features, lin.out_features, bias=bias, has_fp16_weights=False, threshold=INT8_THRESHOLD,
                device="meta",
            )
    if bias:
        q.bias = torch.nn.Parameter(lin.bias.data.to(dtype), requires_grad=False)
    if fake:
        q.weight = _fake_quantized(bnb, weight, quant, dtype)
        return q
    if quant == "nf4":
        q.weight = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type="nf4", compress_statistics=True, quant_storage=dtype
        )
    else:
        q.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    return q.to(device)  # quantises (bitsandbytes does it on the move to a real device)


def _fake_quantized(bnb, weight, quant: str, dtype):
    """The quantised weight of a layer built under FakeTensorMode (the --trace estimator).
    bitsandbytes' parameter classes cannot wrap a fake tensor, so the layer gets a frozen
    Parameter holding what they would hold -- computed by the same bitsandbytes quantisation ops,
    which have fake implementations -- with the attributes its forward, backward and peft read
    (the NF4 quant_state with its constants; LLM.int8's CB and SCB)."""
    import torch

    if quant == "nf4":
        packed, state = bnb.functional.quantize_4bit(
            weight, blocksize=64, compress_statistics=True, quant_type="nf4", quant_storage=dtype
        )
        p = torch.nn.Parameter(packed, requires_grad=False)
        p.quant_state, p.quant_type, p.blocksize = state, "nf4", 64
        p.compress_statistics, p.quant_storage, p.bnb_quantized = True, dtype, True
        return p
    cb, scb, _ = bnb.functional.int8_vectorwise_quant(weight.contiguous().to(torch.float16))
    p = torch.nn.Parameter(cb, requires_grad=False)
    p.CB, p.SCB, p.has_fp16_weights = cb, scb, False
    return p


def quant_constants(layer) -> list:
    """The tensors a quantised layer keeps beside its weight (NF4's absmax and code tables,
    LLM.int8's row scales): not parameters, so neither counted nor partitioned with them."""
    state = getattr(layer.weight, "quant_state", None)
    if state is not None:
        nested = [state.state2.absmax, state.state2.code] if state.nested else []
        return [t for t in (state.absmax, state.code, state.offset, *nested) if t is not None]
    scb = getattr(layer.weight, "SCB", None)
    if scb is None:
        scb = getattr(getattr(layer, "state", None), "SCB", None)
    return [scb] if scb is not None else []


def keep_training_layout(model) -> None:
    """bitsandbytes (0.50.2 on) repacks a 4-bit weight in place into a CPU inference layout on the
    first eval forward without grad on an AVX512-BF16 CPU (the worker's evaluate), and packs it back
    on state_dict assuming uint8 storage; with the storage in the compute dtype (ZeRO-3, FSDP-QLoRA)
    the save then fails, and the packed layout is not the one the memory model counts. Off, here."""
    import bitsandbytes as bnb

    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False


def quantized_layers(model) -> int:
    """How many of `model`'s layers hold quantised weights (either path: ours or transformers')."""
    import bitsandbytes as bnb

    return sum(isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)) for m in model.modules())
