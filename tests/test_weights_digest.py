"""The final-weights digest (logs/weights-rank-N.sha256) that the resume tests compare bitwise."""

from __future__ import annotations

import pytest

from launcher.models.catalog import CATALOG
from launcher.spec import TrainSpec

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")


def tiny(seed: int = 0):
    from launcher.train.model import build_model

    return build_model(CATALOG["tiny-llama"], "", TrainSpec(), init="random", seed=seed, lora_dropout=0.0)


def test_equal_exactly_when_the_weights_are_bitwise_equal():
    from launcher.train.export import weights_digest

    a, b = tiny(), tiny()
    assert weights_digest(a, TrainSpec()) == weights_digest(b, TrainSpec())
    assert weights_digest(tiny(seed=1), TrainSpec()) != weights_digest(a, TrainSpec())
    with torch.no_grad():
        p = next(b.parameters())
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(float("inf"), dtype=p.dtype))  # one ulp
    assert weights_digest(b, TrainSpec()) != weights_digest(a, TrainSpec())


def test_skipped_above_the_size_cap_and_under_autotp(monkeypatch):
    from launcher.train import export

    model = tiny()
    n = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(export, "DIGEST_MAX_PARAMS", n)
    assert export.weights_digest(model, TrainSpec()) is not None
    monkeypatch.setattr(export, "DIGEST_MAX_PARAMS", n - 1)
    assert export.weights_digest(model, TrainSpec()) is None
    monkeypatch.undo()
    assert export.weights_digest(model, TrainSpec(tp=2)) is None
