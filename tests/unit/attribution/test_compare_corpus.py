"""compare() with the shared corpus options: truncation (cut / skip), top_k, progress, and the
checks made before any forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnprobe.attribution.comparison import compare
from attnprobe.errors import InputError
from tests.helpers import tiny_bert_classifier

WORDS = "the cat sat on a mat dog ran big red"
SHORT = ["the big cat sat on a red mat", "a dog ran on the mat"]
LONG_WORDS = ("the cat sat on a mat dog ran " * 10).split()  # 80 words: 82 tokens > 64
LONG = " ".join(LONG_WORDS)
CUT = " ".join(LONG_WORDS[:62])  # what cutting to the model's 64 tokens keeps
VIEWS = ["raw", "rollout", "attn_x_grad", "norm"]
METHODS = ["saliency", "leave_one_out"]


@pytest.fixture
def bert():
    return tiny_bert_classifier(WORDS)


def tables_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True),
                                  check_exact=False, atol=1e-9, rtol=0)


def test_cut_runs_every_view_and_method_on_the_cut_text(bert):
    model, tok = bert
    with pytest.raises(InputError, match="text 0 has 82 tokens but the model takes at most 64"):
        compare(model, tok, [LONG], "class:1", views=VIEWS, methods=METHODS)
    cut = compare(model, tok, [LONG], "class:1", views=VIEWS, methods=METHODS,
                  scope="layer:1", truncation="cut")
    fits = compare(model, tok, [CUT], "class:1", views=VIEWS, methods=METHODS,
                   scope="layer:1")
    assert {len(a.tokens) for a in cut.attributions} == {64}
    assert {"raw@L1", "rollout@L1", "attn_x_grad", "norm@L1", "saliency"} == set(cut.table.source)
    tables_equal(cut.table, fits.table)
    assert cut.skipped == ()


def test_skip_leaves_long_texts_out_and_lists_them(bert):
    model, tok = bert
    texts = [SHORT[0], LONG, SHORT[1]]
    truth = [[t in ("cat", "mat") for t in SHORT[0].split()], [True] * 80,
             [t == "dog" for t in SHORT[1].split()]]
    skipped = compare(model, tok, texts, "class:1", views=["raw", "rollout"], methods=METHODS,
                      truncation="skip", truth=truth)
    assert skipped.skipped == ("1",)
    assert sorted(set(skipped.table.example_id)) == ["0", "2"]
    assert {a.example_id for a in skipped.attributions} == {"0", "2"}
    alone = compare(model, tok, SHORT, "class:1", views=["raw", "rollout"], methods=METHODS,
                    truth=[truth[0], truth[2]])
    # the same rows, example ids kept from the caller's list (2 stays 2)
    renamed = alone.table.assign(example_id=alone.table.example_id.map({"0": "0", "1": "2"}))
    tables_equal(skipped.table, renamed)
    renamed_truth = alone.truth_table.assign(
        example_id=alone.truth_table.example_id.map({"0": "0", "1": "2"}))
    tables_equal(skipped.truth_table, renamed_truth)
    # max_length is a limit too
    short_cap = compare(model, tok, SHORT, "class:1", views=["raw"], methods=["saliency"],
                        truncation="skip", max_length=8)
    assert short_cap.skipped == ("0",) and set(short_cap.table.example_id) == {"1"}
    with pytest.raises(InputError, match="every text is longer"):
        compare(model, tok, [LONG], "class:1", views=["raw"], methods=["saliency"],
                truncation="skip")


def _overlap(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Top-k overlap by hand: k largest |x| and |y|, ties to the earlier position."""
    top_x, top_y = (set(np.argsort(-np.abs(v), kind="stable")[:k].tolist()) for v in (x, y))
    return len(top_x & top_y) / k


@pytest.mark.parametrize("top_k", [1, 3, 100])
def test_top_k_sets_the_overlap_size_and_nothing_else(bert, top_k):
    model, tok = bert
    options = {"views": ["raw", "rollout"], "methods": METHODS}
    default = compare(model, tok, SHORT, "class:1", **options)
    sized = compare(model, tok, SHORT, "class:1", top_k=top_k, **options)
    other = sized.table.metric != "topk_overlap"
    tables_equal(sized.table[other], default.table[default.table.metric != "topk_overlap"])
    scores = {(a.example_id, a.method): a for a in sized.attributions}
    overlap = sized.table[~other]
    for item in overlap.itertuples():
        a, b = scores[(item.example_id, item.source)], scores[(item.example_id, item.method)]
        keep = np.array([t not in ("[CLS]", "[SEP]") for t in a.tokens])
        x, y = a.scores.numpy()[keep], b.scores.numpy()[keep]
        assert item.value == pytest.approx(_overlap(x, y, min(top_k, len(x))), abs=1e-12)
    if top_k == 100:  # capped at the compared tokens: the whole set overlaps
        assert (overlap.value == 1.0).all()
    if top_k == 1:  # a share of one token: 0 or 1, and here not always the same
        assert set(overlap.value) == {0.0, 1.0}


def test_progress_bar_counts_each_method_on_each_text_and_names_the_running_one(bert, capsys):
    model, tok = bert
    compare(model, tok, SHORT, "class:1", views=["raw"], methods=["saliency", "leave_one_out"],
            progress=True)
    err = capsys.readouterr().err
    # 2 texts × (2 methods + the views) = 6 steps; every step is named while it runs, after
    # the count of the steps done before it (so the bar moves between the methods)
    expected = ["0/6", "text 0: saliency", "1/6", "text 0: leave_one_out", "2/6",
                "text 0: attention views", "3/6", "text 1: saliency", "4/6",
                "text 1: leave_one_out", "5/6", "text 1: attention views", "6/6"]
    at = 0
    for piece in expected:
        found = err.find(piece, at)
        assert found >= 0, (piece, err[at:])
        at = found + len(piece)
    assert "step" in err and "compare" in err
    assert "attribute" not in err  # one bar: the attributions run inside it
    compare(model, tok, SHORT, "class:1", views=["raw"], methods=["saliency"])
    assert capsys.readouterr().err == ""


def test_progress_bar_without_views_counts_only_the_methods(bert, capsys):
    model, tok = bert
    compare(model, tok, [*SHORT, SHORT[0]], "class:1", views=[], methods=["saliency",
                                                                          "leave_one_out"],
            progress=True)
    err = capsys.readouterr().err
    assert "6/6" in err and "attention views" not in err and "text 2: leave_one_out" in err


@pytest.mark.parametrize(("options", "message"), [
    ({"top_k": 0}, "top_k must be a positive integer"),
    ({"top_k": 2.5}, "top_k must be a positive integer"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"n_steps": -1}, "n_steps must be a positive integer"),
    ({"query": "middle"}, "query must be one of"),
    ({"truncation": "drop"}, "unknown truncation 'drop'"),
    ({"views": ["raw", "raw"]}, "views must be distinct names"),
    ({"scope": "head:0.5"}, r"heads \[5\] out of range"),
])
def test_bad_options_are_refused_before_any_forward(bert, options, message):
    model, tok = bert
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(InputError, match=message):
            compare(model, tok, SHORT, "class:1", **{"views": ["raw"], "methods": ["saliency"],
                                                     **options})
    finally:
        handle.remove()
    assert calls == []


def test_no_views_compares_the_methods_only(bert):
    model, tok = bert
    result = compare(model, tok, SHORT, "class:1", views=[], methods=METHODS)
    assert set(result.table.source_kind) == {"attribution"}
    assert len(result.table) == len(SHORT) * 4  # one pair of methods, four metrics
