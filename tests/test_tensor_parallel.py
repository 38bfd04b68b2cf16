"""The tensor-parallel layers (launcher/parallel/tensor.py) compute the model's own loss and
gradients: a one-block Llama split over 2 gloo ranks against the same model on one process,
full fine-tuning and LoRA (whose adapters split with their base linears), every gradient gathered
whole and compared; and the vocabulary-parallel embedding, head and cross-entropy against
transformers' own."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = pytest.mark.slow


def _model(lora: bool):
    import peft
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=128, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).float()
    if not lora:
        return model
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero, which would hide A's gradient
            torch.nn.init.normal_(p, std=0.05)
    return model


def _whole(p, grad):
    dim = getattr(p, "tp_dim", None)
    if dim is None:
        return grad
    parts = [torch.empty_like(grad) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, grad.contiguous())
    return torch.cat(parts, dim)


def _rank(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from launcher.parallel import tensor
    from launcher.parallel.stages import causal_lm_loss

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    tp = tensor.Group(rank, 2, dist.group.WORLD)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    worst = {}
    for lora in (False, True):
        ref, split = _model(lora), _model(lora)
        ref_loss = ref(input_ids=ids, labels=ids).loss
        ref_loss.backward()
        base = split.get_base_model() if lora else split
        tensor.shard_block(base.model.layers[0], "llama", tp)
        loss = split(input_ids=ids, labels=ids).loss
        loss.backward()
        want = dict(ref.named_parameters())
        diff = [abs(float(loss) - float(ref_loss))]
        for name, p in split.named_parameters():
            if p.grad is not None:
                g = want[name].grad
                diff.append(float((_whole(p, p.grad) - g).abs().max() / (g.abs().max() + 1e-12)))
        worst["lora" if lora else "full"] = max(diff)
    # the vocabulary-parallel embedding, head and loss against the whole ones
    torch.manual_seed(2)
    emb, head = torch.nn.Embedding(128, 16), torch.nn.Linear(16, 128, bias=False)
    emb_split, head_split = torch.nn.Embedding(128, 16), torch.nn.Linear(16, 128, bias=False)
    emb_split.load_state_dict(emb.state_dict())
    head_split.load_state_dict(head.state_dict())
    labels = ids.masked_fill(ids % 5 == 0, -100)
    ref_loss = causal_lm_loss(head(emb(ids)), labels)
    ref_loss.backward()
    vocab_in, vocab_out = tensor.shard_embedding(emb_split, tp), tensor.shard_head(head_split, tp)
    logits = vocab_out.logits(head_split.weight, vocab_in.lookup(emb_split, ids))
    loss = tensor.vocab_parallel_loss(tp, -100)(logits, labels)
    loss.backward()
    diff = [abs(float(loss) - float(ref_loss))]
    for p, whole in ((emb_split.weight, emb.weight), (head_split.weight, head.weight)):
        diff.append(float((_whole(p, p.grad) - whole.grad).abs().max() / whole.grad.abs().max()))
    worst["vocab"] = max(diff)
    if rank == 0:
        out.put(worst)
    dist.destroy_process_group()


def test_split_layers_give_the_whole_models_loss_and_gradients():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    worst = out.get(timeout=240)
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    # fp32 on both sides: only the order of the partial sums differs
    assert worst["full"] < 1e-5 and worst["lora"] < 1e-5 and worst["vocab"] < 1e-5, worst
