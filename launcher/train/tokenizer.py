"""Tokenizers: the one the user names, or a byte-level one built locally (no download).

The local tokenizer maps every UTF-8 byte to one token (ids 0-255) plus <pad>, <s>, </s>: any
text round-trips, and it fits tiny test models (vocab >= 259). Its chat template is
launcher/train/chat.py's BYTE_TEMPLATE.
"""

from __future__ import annotations

from pathlib import Path

from launcher.errors import FtlaunchError
from launcher.train.chat import BYTE_TEMPLATE

SPECIALS = ["<pad>", "<s>", "</s>"]
BYTE_VOCAB = 256 + len(SPECIALS)


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIALS:
        vocab[tok] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    out.chat_template = BYTE_TEMPLATE  # conversations render offline too (demos, tests)
    return out


def load_tokenizer(name: str | None, model_source: str, vocab_size: int):
    if name is None:
        if vocab_size < BYTE_VOCAB:
            raise FtlaunchError(
                f"the model's vocabulary ({vocab_size}) is smaller than the built-in byte tokenizer's "
                f"({BYTE_VOCAB}); set training.tokenizer in plan.json"
            )
        return byte_tokenizer()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        where = "path" if Path(name).exists() else "hub id (offline: it must be in the local cache)"
        raise FtlaunchError(
            f"cannot load tokenizer {name!r} as a {where}: {str(exc).splitlines()[0]}"
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
