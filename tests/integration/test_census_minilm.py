"""The head census on the real all-MiniLM-L6-v2: syntactic heads beat the offset baseline.

Trees come from the packaged spaCy parser on sentences written for the census
(``analyses/data/census_sentences.txt``); the baseline is the best fixed offset per relation
(Clark et al. 2019). Expected values are independent of attnprobe: counts of relations come
from the trees themselves, offsets are recomputed here from the trees, and the sink-aware and
repeated-token scores are recomputed here from captured maps with the definitions written out.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.heads import RULES, census, parse
from attnprobe.heads.probe import repeated_token_scores, repeated_tokens
from tests.conftest import track

CORPUS = Path(__file__).parents[2] / "analyses" / "data" / "census_sentences.txt"
N_SENTENCES = 150
MARGIN = 0.15  # "by a clear margin": 15 accuracy points over the best fixed offset


@pytest.fixture(scope="module")
def result():
    model, tok = ap.load_model("minilm")
    track(model)
    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    trees = parse(texts)
    return trees, census(model, tok, trees=trees)


def _offset_accuracy(trees, relation: str, offset: int) -> float:
    hits = total = 0
    for tree in trees:
        for i, (head, rel) in enumerate(zip(tree.heads, tree.relations, strict=True)):
            if rel == relation and head != 0:
                total += 1
                hits += head - 1 == i + offset
    return hits / total


@pytest.mark.parametrize("relation", ["det", "dobj"])
def test_a_head_beats_the_best_offset_baseline(result, relation):
    trees, found = result
    table = found.syntax().set_index("relation")
    row = table.loc[relation]
    count = sum(Counter(t.relations)[relation] for t in trees)
    assert row["count"] == count
    best_offset = max(range(-3, 4), key=lambda o: (o != 0, _offset_accuracy(trees, relation, o)))
    assert row["baseline"] == pytest.approx(_offset_accuracy(trees, relation, best_offset))
    assert row["accuracy"] >= row["baseline"] + MARGIN, row.to_dict()


def test_every_head_gets_a_label_and_its_evidence(result):
    _, found = result
    labels = found.classify()
    assert len(labels) == 6 * 12
    assert set(labels["label"]) <= set(RULES.precedence())
    fired = labels[labels["label"] != "heterogeneous"]
    assert (fired["evidence"].str.len() > 0).all()
    # BERT-style models keep [CLS]/[SEP] sinks and at least one syntactic head (Clark et al.)
    assert {"sink", "syntactic"} <= set(labels["label"])
    profile = found.layer_profile()
    shares = profile[[f"share_{label}" for label in RULES.precedence()]].sum(axis=1)
    assert shares.to_numpy() == pytest.approx(1.0)
    families = profile[[f"family_{name}" for name in RULES.families()]].sum(axis=1)
    assert families.to_numpy() == pytest.approx(1.0)
    assert all(RULES.family(label) == family
               for label, family in zip(labels["label"], labels["family"], strict=True))
    # the first token ([CLS]) is always a sink key
    assert (labels["sink"] >= labels["first"] - 1e-9).all() and labels["sink"].le(1).all()


def test_repeated_token_scores_and_distances_are_present(result):
    _, found = result
    scores = found.scores()
    for column in ("rep_prev", "rep_duplicate", "rep_induction"):
        assert scores[column].between(0, 1).all(), column
    distances = found.distances()
    assert len(distances) == 72 * 71 // 2
    assert distances["js"].between(0, 0.6932).all()  # JS in nats is at most ln 2


def test_sentence_pairs_get_block_scores():
    """A tab splits a line into a pair, encoded [CLS] a [SEP] b [SEP]: ``block`` exists only
    then, and a segment-blind uniform share would be near one half."""
    model, tok = ap.load_model("minilm")
    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:40]
    pairs = [f"{a}\t{b}" for a, b in zip(texts[::2], texts[1::2], strict=True)]
    paired = census(track(model), tok, pairs, repeated=False, similarity=False).scores()
    assert paired["block"].between(0, 1).all()
    assert paired["block"].max() > 0.75  # some heads stay inside their own sentence
    single = census(model, tok, texts[:10], repeated=False, similarity=False).scores()
    assert "block" not in single.columns


def test_the_probe_adds_rep_scores_without_touching_corpus_scores():
    model, tok = ap.load_model("minilm")
    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:16]
    with_probe = census(track(model), tok, texts, similarity=False).scores()
    without = census(model, tok, texts, similarity=False, repeated=False).scores()
    rep = [c for c in with_probe if c.startswith("rep_")]
    assert len(rep) == 5 and not any(c.startswith("rep_") for c in without)
    pd.testing.assert_frame_equal(with_probe.drop(columns=rep), without, check_exact=True)


def test_sink_free_scores_match_the_maps():
    """On 24 sentences: ``sink`` and ``prev_nosink`` of every head, recomputed from the
    captured maps. Sink keys of a head in a sentence: [CLS] (the first token) and every key
    taking more than 0.3 of the mass in more than half of the rows (all rows see every key);
    ``prev_nosink`` = Σ_i a[i, i-1] over non-sink i-1 / Σ_i (mass on non-sink keys)."""
    model, tok = ap.load_model("minilm")
    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:24]
    table = census(track(model), tok, texts, repeated=False, similarity=False).scores()
    table = table.set_index(["layer", "head"])
    maps = ap.extract(model, tok, texts)
    sink = torch.zeros(6, 12, dtype=torch.float64)
    on_prev = torch.zeros_like(sink)
    rest = torch.zeros_like(sink)
    rows = 0
    for amap in maps:
        a = amap.pattern.double()  # [layer, head, query, key]
        n = a.shape[-1]
        columns = ((a > 0.3).sum(2) > 0.5 * n) & (n >= 4)  # [layer, head, key]
        sinks = columns.clone()
        sinks[..., 0] = True
        on_sink = (a * sinks[:, :, None, :]).sum(-1)  # [layer, head, query]
        sink += on_sink.sum(-1)
        rest += (1 - on_sink).sum(-1)
        prev_keys = ~sinks[..., :-1]  # key i - 1 of rows 1..n-1
        on_prev += (a.diagonal(-1, 2, 3) * prev_keys).sum(-1)
        rows += n
    for layer in range(6):
        for head in range(12):
            row = table.loc[(layer, head)]
            assert row["sink"] == pytest.approx(float(sink[layer, head]) / rows, abs=1e-5)
            assert row["prev_nosink"] == pytest.approx(
                float(on_prev[layer, head] / rest[layer, head]), abs=1e-5)


def test_the_probe_is_cls_x_x_sep_and_rep_prev_reads_its_diagonal():
    """The probe of a BERT tokenizer is ``[CLS] x_1..x_m x_1..x_m [SEP]`` (what
    ``tokenizer(text)`` adds); ``rep_prev`` is the mean over content rows i >= 2 of
    a[i, i-1] renormalised over the content keys ([CLS] and [SEP] left out)."""
    model, tok = ap.load_model("minilm")
    track(model)
    batch = repeated_tokens(tok, length=32, seed=0)
    ids = batch["input_ids"]
    assert ids.shape == (4, 66)
    assert (ids[:, 0] == tok.cls_token_id).all() and (ids[:, -1] == tok.sep_token_id).all()
    assert torch.equal(ids[:, 1:33], ids[:, 33:65])
    with torch.no_grad(), ap.capture(model, tokenizer=tok) as cap:
        model(**batch)
    expected = torch.zeros(6, 12, dtype=torch.float64)
    for amap in cap.maps:
        a = amap.pattern.double()  # [layer, head, 66, 66]
        content = a[..., 1:65].sum(-1)  # mass on the content keys, per row
        rows = torch.arange(2, 65)
        expected += (a[..., rows, rows - 1] / content[..., rows]).mean(-1)
    expected /= len(cap.maps)
    found = repeated_token_scores(model, tok, length=32, seed=0).summary()
    found = found.set_index(["layer", "head"])["rep_prev"]
    for layer in range(6):
        for head in range(12):
            assert found.loc[(layer, head)] == pytest.approx(float(expected[layer, head]),
                                                             abs=1e-5)
