"""--packing: the training samples concatenated into rows of up to seq_len tokens, so a step
trains on real tokens instead of padding (2-5x the real tokens per step on short instruction data).

Rows are packed once per run from the sample lengths alone (the same on every rank and every start):
best fit decreasing, the longest sample first, each into the row with the least room that holds it.
A sample is never split. Within a row the position ids restart at 0 for every sample: that is how
transformers finds the boundaries when no attention mask is given (masking_utils'
find_packed_sequence_indices), so sdpa and eager attention get a block-diagonal causal mask and
flash-attn its variable-length kernel, and no token attends across samples. Each sample's first
label is ignored (the previous sample's last token would otherwise be trained to predict it), which
unpacked training never counts either (a row's first label has nothing before it), so a packed
batch has the loss of the same samples unpacked (tests/test_packing.py).

Families whose attention takes no position ids (BLOOM's ALiBi, OPT's learned positions from the
attention mask) mix samples in a row; they are refused (launcher/models/hf_families.py: PACKED_FAMILIES).
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.models.hf_families import PACKED_FAMILIES
from launcher.train.data import IGNORE, Examples, epoch_order


def pack(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    """Rows of sample indices, each row's lengths summing to at most seq_len (best fit decreasing).
    The rooms left are buckets indexed by size; one integer's bits say which are non-empty, so the
    smallest room that fits is a shift and a lowest-bit lookup (~3 s per million samples on one core)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rooms: list[list[int]] = [[] for _ in range(seq_len + 1)]  # room left -> rows with that room
    nonempty = 0  # bit r set: rooms[r] holds a row
    rows: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        if not 0 < n <= seq_len:
            raise ValueError(f"sample {i} has {n} tokens, not 1..{seq_len}")
        fits = nonempty >> n
        if fits:
            room = n + (fits & -fits).bit_length() - 1
            r = rooms[room].pop()
            if not rooms[room]:
                nonempty &= ~(1 << room)
        else:
            room, r = seq_len, len(rows)
            rows.append([])
        rows[r].append(i)
        left = room - n
        if left:
            if not rooms[left]:
                nonempty |= 1 << left
            rooms[left].append(r)
    return rows


class _Rows:
    """One of a packed set's sequences (ids, labels or positions), a row at a time, as numpy arrays."""

    def __init__(self, ex: Examples, rows: list[list[int]], kind: str) -> None:
        self.ex, self.rows, self.kind = ex, rows, kind

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, r: int):
        import numpy as np

        parts = []
        for i in self.rows[r]:
            if self.kind == "ids":
                parts.append(np.asarray(self.ex.input_ids[i], dtype=np.int64))
            elif self.kind == "labels":
                lab = np.array(self.ex.labels[i], dtype=np.int64)
                lab[0] = IGNORE
                parts.append(lab)
            else:
                parts.append(np.arange(len(self.ex.input_ids[i]), dtype=np.int64))
        return np.concatenate(parts)


def packed(ex: Examples, seq_len: int) -> tuple[Examples, dict]:
    """The set as packed rows (with their position ids), and what packing did: samples, rows, and
    the share of the rows' seq_len tokens that are real (the rest is padding)."""
    lengths = [len(s) for s in ex.input_ids]
    rows = pack(lengths, seq_len)
    out = Examples(_Rows(ex, rows, "ids"), _Rows(ex, rows, "labels"), ex.skipped, ex.no_target,
                   position_ids=_Rows(ex, rows, "positions"))
    fill = sum(lengths) / (len(rows) * seq_len)
    return out, {"samples": len(lengths), "rows": len(rows), "fill": round(fill, 4)}


def real_share(lengths: Sequence[int], micro: int, seed: int) -> float:
    """Real tokens over the tokens a step computes, for rows of these lengths in the worker's first
    epoch: each micro-batch computes `micro` rows as long as its longest (the padding too)."""
    order = epoch_order(len(lengths), seed, 0)
    real = computed = 0
    for k in range(0, len(order), micro):
        group = [lengths[i] for i in order[k : k + micro]]
        real += sum(group)
        computed += micro * max(group)
    return real / computed


def data_note(ex: Examples, spec, seed: int, plan_tokens_per_s: float | None, model_type: str) -> str:
    """What the plan's tokens/s become on this data set: the share of computed tokens that are real,
    with the rows as the run packs them (or not), and what --packing would make of it."""
    lengths = [len(s) for s in ex.input_ids]
    rows = [sum(lengths[i] for i in row) for row in pack(lengths, spec.seq_len)]
    plain, packed_share = real_share(lengths, spec.micro_batch, seed), real_share(rows, spec.micro_batch, seed)
    share = packed_share if spec.packing else plain
    what = (
        f"--packing puts {len(lengths)} samples into {len(rows)} rows"
        if spec.packing
        else f"{len(lengths)} samples of {sum(lengths) / len(lengths):.0f} tokens on average (--seq-len {spec.seq_len})"
    )
    note = f"data: {what}; {share:.0%} of the tokens a step computes are real"
    if plan_tokens_per_s:
        note += f": the plan's {plan_tokens_per_s:,.0f} tokens/s are about {share * plan_tokens_per_s:,.0f} real tokens/s"
    if spec.packing and spec.attention == "sdpa":
        note += " (sdpa runs packed rows with a mask; --attention flash packs them without one, faster and smaller)"
    if not spec.packing and packed_share > 1.25 * plain and spec.pp == 1 and model_type in PACKED_FAMILIES:
        note += f" (--packing: {packed_share:.0%}, {packed_share / plain:.1f}x the real tokens per step)"
    return note
