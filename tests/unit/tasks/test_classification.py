"""Training the attention classifiers on ``contains``: accuracy by construction, determinism,
held-out accuracy of every classifier, and where the trained attention puts its mass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.tasks.classification import accuracy, train_classifier
from attnprobe.tasks.keytoken import make_examples
from tests.conftest import track

NAMES = ("bilstm-classifier", "average-classifier", "transformer-classifier")
TRAIN = {"steps": 60, "batch_size": 32, "lr": 1e-2, "seed": 0}


class KeyOracle(nn.Module):
    """Logit 1 iff the id ``key_id`` occurs among the real tokens (or the opposite)."""

    def __init__(self, key_id: int, flip: bool = False) -> None:
        super().__init__()
        self.key_id, self.flip = key_id, flip

    def forward(self, input_ids, attention_mask=None):
        hit = ((input_ids == self.key_id) & attention_mask.bool()).any(1)
        hit = hit ^ self.flip
        return torch.stack([(~hit).float(), hit.float()], dim=1)


def test_accuracy_by_construction():
    _, tok = build_reference("average-classifier")
    data = make_examples("contains", 33, seed=1)
    key_id = tok.convert_tokens_to_ids(["key"])[0]
    assert accuracy(KeyOracle(key_id), tok, data, batch_size=4) == 1.0
    assert accuracy(KeyOracle(key_id, flip=True), tok, data) == 0.0


def test_training_is_deterministic_and_leaves_the_global_rng_alone():
    data = make_examples("contains", 64, seed=1)
    results, weights = [], []
    for _ in range(2):
        model, tok = build_reference("average-classifier")
        state = torch.get_rng_state()
        results.append(train_classifier(model, tok, data, steps=5, batch_size=16, lr=1e-2,
                                        seed=7))
        assert torch.equal(state, torch.get_rng_state())
        assert not model.training
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])
    assert results[0]["final_loss"] == results[1]["final_loss"]
    assert results[0]["held_out_accuracy"] is None and results[0]["steps"] == 5


def test_bad_training_arguments():
    model, tok = build_reference("average-classifier")
    data = make_examples("contains", 8)
    with pytest.raises(InputError, match="steps"):
        train_classifier(model, tok, data, steps=0, batch_size=4, lr=1e-2, seed=0)


@pytest.fixture(scope="module")
def trained():
    """Each classifier trained once on ``contains`` (a few seconds in all, one thread)."""
    train = make_examples("contains", 400, min_len=4, max_len=12, seed=1)
    held_out = make_examples("contains", 200, min_len=4, max_len=12, seed=2)
    out = {}
    for name in NAMES:
        model, tok = build_reference(name, seed=0)
        out[name] = (model, tok, train_classifier(model, tok, train, held_out=held_out, **TRAIN))
    return out, held_out


@pytest.mark.parametrize("name", NAMES)
def test_every_classifier_learns_contains(trained, name):
    models, _ = trained
    result = models[name][2]
    assert result["held_out_accuracy"] >= 0.95, result
    assert result["train_accuracy"] >= 0.95, result
    assert result["seconds"] > 0, result  # recorded; speed belongs to benchmarks, not tests


@pytest.mark.parametrize("name", NAMES)
def test_trained_attention_is_captured_with_rows_summing_to_one(trained, name):
    models, held_out = trained
    model, tok, _ = models[name]
    model = track(model)
    part = held_out.select(range(8))
    with torch.no_grad(), ap.capture(model, tokenizer=tok) as cap:
        model(**tok(part.texts, padding_side="left"))
    for amap, words in zip(cap.maps, part.words, strict=True):
        assert amap.key_tokens == ("[BOS]", *words)
        assert torch.allclose(amap.pattern.sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("name", ["bilstm-classifier", "average-classifier"])
def test_trained_additive_attention_focuses_on_the_key(trained, name):
    """J&W / Bahdanau behaviour: the single tanh-attention layer puts most of its mass on
    the decisive tokens (measured: ≈1.0 for the BiLSTM, ≈0.93-0.99 for "average")."""
    models, held_out = trained
    model, tok, _ = models[name]
    positives = held_out.select(held_out.has_decisive.nonzero().flatten())
    with torch.no_grad(), ap.capture(track(model), tokenizer=tok) as cap:
        model(**tok(positives.texts))
    masses = [float(amap.pattern[0, 0, 0][mask].sum())
              for amap, mask in zip(cap.maps, positives.token_decisive(), strict=True)]
    assert sum(masses) / len(masses) > 0.5
