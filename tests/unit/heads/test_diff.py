"""``heads.diff``: two checkpoints compared head by head, on tiny BERTs whose differences are
known by construction (a model and itself; one head made uniform by hand)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.heads import census
from attnprobe.heads.checkpoint_diff import Diff, diff, diff_censuses
from attnprobe.heads.paired_attention import AttentionChange, attention_change
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

TEXTS = ["the cat sat on a mat", "a big dog ran", "the red cat ran on the mat", "a dog sat",
         "w1 w2 the cat w1 w2 w3"]
# enough ordinary tokens for the default repeated-token probe (2 x 32 draws)
WORDS = "the cat sat on a mat dog ran big red " + " ".join(f"w{i}" for i in range(40))
LAST, UNIFORM_HEAD = 1, 1  # the head made uniform: the last layer's, so no other head changes


@pytest.fixture(scope="module")
def bert():
    vocab = bert_vocab(WORDS)
    return tiny_bert(vocab), bert_tokenizer(vocab)


def uniform_head(model: torch.nn.Module, layer: int, head: int) -> torch.nn.Module:
    """A copy whose ``head`` of ``layer`` has zero queries: every score 0, so its weights are
    uniform over the real keys."""
    changed = track(copy.deepcopy(model))
    query = changed.encoder.layer[layer].attention.self.query
    size = changed.config.hidden_size // changed.config.num_attention_heads
    with torch.no_grad():
        query.weight[head * size:(head + 1) * size] = 0
        query.bias[head * size:(head + 1) * size] = 0
    return changed


def js_by_hand(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence in nats, written out (0 ln 0 = 0)."""
    m = (p + q) / 2
    kl = lambda x: float(np.sum(np.where(x > 0, x * np.log(np.where(x > 0, x, 1) / m), 0.0)))  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def changed_columns(heads) -> list[str]:
    return [c for c in heads.columns if c.endswith("_change")]


def test_a_model_diffed_with_itself_changes_nothing(bert):
    model, tok = bert
    for other in (model, track(copy.deepcopy(model))):
        result = diff(model, other, tok, TEXTS, batch_size=2)
        heads = result.heads()
        assert len(heads) == 4 and not heads["label_changed"].any()
        assert (heads["label_a"] == heads["label_b"]).all()
        assert (heads["js"] == 0).all() and (heads["js_max"] == 0).all()
        assert np.allclose(heads["cosine"], 1.0, atol=1e-12)
        changes = heads[changed_columns(heads)]
        assert changes.shape[1] > 20 and (changes.fillna(0) == 0).all().all()
        scores = result.scores()
        assert (scores["change"].fillna(0) == 0).all()
        layers = result.layers()
        assert (layers["js"] == 0).all() and (layers["label_changed"] == 0).all()
        assert "attention unchanged" in repr(result)


def test_one_uniform_head_has_the_js_computed_by_hand_and_the_others_zero(bert):
    model, tok = bert
    changed = uniform_head(model, LAST, UNIFORM_HEAD)
    result = diff(model, changed, tok, TEXTS, batch_size=3)
    heads = result.heads().set_index(["layer", "head"])

    # independently: the original maps, each row against the uniform row over its keys
    maps = ap.extract(model, tok, TEXTS)
    rows, cosines, entropy_b = [], [], []
    for amap in maps:
        pattern = amap.pattern[LAST, UNIFORM_HEAD].double().numpy()  # [query, key]
        n = pattern.shape[1]
        uniform = np.full_like(pattern, 1 / n)
        rows += [js_by_hand(row, uniform[0]) for row in pattern]
        cosines.append(float((pattern * uniform).sum()
                             / (np.linalg.norm(pattern) * np.linalg.norm(uniform))))
        entropy_b += [math.log(n)] * n
    target = heads.loc[(LAST, UNIFORM_HEAD)]
    assert target["js"] == pytest.approx(np.mean(rows), rel=1e-7)
    assert target["js_max"] == pytest.approx(max(rows), rel=1e-7)
    assert target["cosine"] == pytest.approx(np.mean(cosines), rel=1e-7)
    assert target["rows"] == len(rows) and target["examples"] == len(TEXTS)
    others = heads.drop(index=(LAST, UNIFORM_HEAD))
    assert (others["js"] <= 1e-12).all() and np.allclose(others["cosine"], 1, atol=1e-9)
    assert not others["label_changed"].any()

    # the census of B sees the uniform head: entropy ln(keys) per row, the change is B - A
    scores = result.scores().set_index(["layer", "head", "score"])
    entropy = scores.loc[(LAST, UNIFORM_HEAD, "entropy")]
    assert entropy["b"] == pytest.approx(np.mean(entropy_b), rel=1e-6)
    alone = census(model, tok, TEXTS, batch_size=3, similarity=False).scores()
    alone = alone.set_index(["layer", "head"])
    assert entropy["a"] == pytest.approx(alone.loc[(LAST, UNIFORM_HEAD), "entropy"], abs=1e-9)
    assert target["entropy_change"] == pytest.approx(entropy["b"] - entropy["a"], abs=1e-12)

    # the layer summary follows from the heads
    layers = result.layers().set_index("layer")
    assert layers.loc[LAST, "js"] == pytest.approx(target["js"] / 2, rel=1e-9)
    assert layers.loc[LAST, "top_head"] == f"L{LAST}H{UNIFORM_HEAD}"
    assert layers.loc[LAST, "js_rank"] == 1 and layers.loc[0, "js"] <= 1e-12
    assert layers.loc[LAST, "label_changed"] == int(target["label_changed"])
    assert layers.loc[LAST, "label_changed_share"] == int(target["label_changed"]) / 2


def test_padding_and_batching_do_not_change_the_divergence(bert):
    model, tok = bert
    changed = uniform_head(model, LAST, UNIFORM_HEAD)
    one = attention_change(model, changed, tok, TEXTS, batch_size=1).to_frame()
    all_at_once = attention_change(model, changed, tok, TEXTS, batch_size=5).to_frame()
    assert np.allclose(one["js"], all_at_once["js"], rtol=1e-6, atol=1e-12)
    assert np.allclose(one["cosine"], all_at_once["cosine"], rtol=1e-6)
    assert (one["rows"] == all_at_once["rows"]).all()


def test_changes_merge_like_the_census(bert):
    model, tok = bert
    changed = uniform_head(model, LAST, UNIFORM_HEAD)
    whole = attention_change(model, changed, tok, TEXTS, batch_size=1)
    parts = [attention_change(model, changed, tok, TEXTS[:2], batch_size=1),
             attention_change(model, changed, tok, TEXTS[2:], batch_size=1)]
    merged = sum(parts)
    assert isinstance(merged, AttentionChange) and merged.heads == whole.heads
    assert torch.allclose(merged.js, whole.js, rtol=1e-12)
    assert torch.equal(merged.js_max, whole.js_max) and torch.equal(merged.rows, whole.rows)


def test_diff_of_two_censuses_equals_the_score_part_of_the_model_diff(bert):
    model, tok = bert
    changed = uniform_head(model, LAST, UNIFORM_HEAD)
    full = diff(model, changed, tok, TEXTS, repeated=False).heads()
    alone = diff_censuses(census(model, tok, TEXTS, repeated=False, similarity=False),
                          census(changed, tok, TEXTS, repeated=False, similarity=False))
    heads = alone.heads()
    assert alone.change is None and "js" not in heads and "js" not in alone.layers()
    assert list(heads.columns) == [c for c in full.columns if c not in
                                   ("js", "js_max", "cosine", "rows", "examples")]
    columns = changed_columns(heads)
    assert len(columns) > 20 and columns == changed_columns(full)
    assert np.allclose(heads[columns].fillna(0), full[columns].fillna(0), atol=1e-9)


def test_the_same_encoder_inside_a_classifier_changes_nothing(bert):
    """``bert.encoder.layer`` of a classifier lines up with ``encoder.layer`` of the bare
    model it was fine-tuned from."""
    model, tok = bert
    classifier = track(transformers.BertForSequenceClassification(model.config).eval())
    classifier.bert.load_state_dict(model.state_dict(), strict=False)
    heads = diff(model, classifier, tok, TEXTS, repeated=False).heads()
    assert set(heads["stack"]) == {"encoder.layer"} and len(heads) == 4
    assert (heads["js"] == 0).all() and not heads["label_changed"].any()


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def bert_of(vocab, **sizes) -> transformers.BertModel:
    torch.manual_seed(0)
    config = dict(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    return track(transformers.BertModel(transformers.BertConfig(**{**config, **sizes})).eval())


@pytest.mark.parametrize("sizes, message", [
    ({"num_hidden_layers": 3}, "differ in shape: 2 layers x 2 heads vs 3 x 2"),
    ({"num_attention_heads": 4}, "differ in shape: 2 layers x 2 heads vs 2 x 4"),
])
def test_models_of_different_shapes_are_refused(bert, sizes, message):
    model, tok = bert
    with pytest.raises(InputError) as excinfo:
        diff(model, bert_of(bert_vocab(WORDS), **sizes), tok, TEXTS)
    assert message in one_line(excinfo)


def test_different_vocabularies_and_tokenizers_are_refused(bert):
    model, tok = bert
    bigger = bert_vocab(WORDS + " extra words")
    with pytest.raises(InputError) as excinfo:
        diff(model, bert_of(bigger), tok, TEXTS)
    assert "vocabularies differ (55 vs 57 token embeddings)" in one_line(excinfo)
    swapped = bert_vocab(WORDS.replace("cat sat", "sat cat"))  # same size, other ids
    with pytest.raises(InputError) as excinfo:
        diff(model, model, tok, TEXTS, tokenizer_b=bert_tokenizer(swapped))
    assert "the tokenizers differ" in one_line(excinfo)


def test_a_model_in_training_mode_is_refused(bert):
    model, tok = bert
    training = track(copy.deepcopy(model)).train()
    with pytest.raises(InputError) as excinfo:
        diff(model, training, tok, TEXTS)
    assert "model_b is in training mode" in one_line(excinfo)


def test_censuses_of_different_corpora_or_heads_are_refused(bert):
    model, tok = bert
    base = census(model, tok, TEXTS, repeated=False, similarity=False)
    fewer = census(model, tok, TEXTS[:3], repeated=False, similarity=False)
    with pytest.raises(InputError) as excinfo:
        diff_censuses(base, fewer)
    assert "different corpora (5 vs 3 sentences" in one_line(excinfo)
    longer = census(model, tok, [t + " red" for t in TEXTS], repeated=False, similarity=False)
    with pytest.raises(InputError) as excinfo:
        diff_censuses(base, longer)
    assert "different corpora or tokenizers (37 vs 42 token rows in 5 sentences)" in \
        one_line(excinfo)
    layer = census(model, tok, TEXTS, scope="layer:1", repeated=False, similarity=False)
    with pytest.raises(InputError) as excinfo:
        diff_censuses(base, layer)
    assert "different heads (2 layers x 2 heads vs 1 layers x 2 heads)" in one_line(excinfo)
    with pytest.raises(InputError) as excinfo:
        Diff(base, "not a census")
    assert "census_b must be a Census" in one_line(excinfo)


def test_texts_or_trees_and_bad_options(bert):
    model, tok = bert
    with pytest.raises(InputError, match="give texts or trees"):
        diff(model, model, tok)
    with pytest.raises(InputError, match="max_length must be a positive integer"):
        diff(model, model, tok, TEXTS, max_length=0)
    with pytest.raises(InputError, match="text 1 is empty"):
        diff(model, model, tok, ["the cat", " "])


def _diff_tables(rank: int) -> dict | None:
    """One rank of a sharded diff (a tiny BERT and its uniform-head copy)."""
    vocab = bert_vocab(WORDS)
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)
    result = diff(model, uniform_head(model, LAST, UNIFORM_HEAD), tok, TEXTS * 3, batch_size=2)
    return {"heads": result.heads(), "layers": result.layers()} if rank == 0 else None


def test_two_processes_give_exactly_the_single_process_diff(tmp_path):
    from tests.integration.distributed import run_ranks

    single = run_ranks(_diff_tables, world=1, folder=tmp_path)[0]
    sharded = run_ranks(_diff_tables, world=2, folder=tmp_path)[0]
    for name in ("heads", "layers"):
        pd.testing.assert_frame_equal(single[name], sharded[name], check_exact=True)
    assert (single["heads"]["js"] > 0).sum() == 1
