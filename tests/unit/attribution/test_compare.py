"""compare(): agreement values known by construction, ground truth on a trained key-token
classifier, the tidy tables and their summaries, special tokens, targets and errors."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import kendalltau, spearmanr
from torch import nn

import attnprobe as ap
from attnprobe.attribution.comparison import AGREEMENT_COLUMNS, TRUTH_COLUMNS, compare
from attnprobe.capture import HookPoint
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.tasks.classification import train_classifier
from attnprobe.tasks.keytoken import make_examples
from tests.conftest import track
from tests.helpers import tiny_bert_classifier

METRICS = ("kendall_tau", "spearman", "topk_overlap", "jsd")
RANK_METRICS = ("kendall_tau", "spearman")
TEXTS = ["the cat sat on a mat", "a big dog ran to the red house", "she saw the bird"]


# ---------------------------------------------------------------------------- by construction
class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_pattern = HookPoint()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attention()


class KeyScorePool(nn.Module):
    """One layer, one head: every query row is ``α = softmax_j(s[id_j])`` over the real tokens,
    with ``s`` a table of its own (not the input embeddings), and ``y = Σ_j α_j (w·e_j)``.

    ``α`` does not depend on the embeddings ``e``, so ``∂y/∂e_j = α_j w``: saliency is
    ``α_j‖w‖`` (the attention, scaled), input × gradient ``α_j (w·e_j)``, and deleting token
    ``j`` gives ``y_{-j} = (y − α_j v_j) / (1 − α_j)`` with ``v_j = w·e_j``. Rollout and flow at
    the one layer read ``0.5·α + 0.5·[j = 0]``: the attention again on every token but the
    first ([BOS])."""

    def __init__(self, vocab_size: int, d: int = 4, bos_score: float = -6.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)  # the input embeddings (attributed)
        self.score = nn.Embedding(vocab_size, 1)  # attention logits, one per token id
        self.w = nn.Parameter(torch.randn(d))
        self.blocks = nn.ModuleList([_Block()])
        with torch.no_grad():
            self.score.weight[WordTokenizer.bos_token_id] = bos_score  # [BOS]: least attended

    def attention(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        logits = self.score(input_ids)[..., 0].masked_fill(mask == 0, float("-inf"))
        return torch.softmax(logits, -1)  # [batch, key]

    def values(self, input_ids):
        return self.embed(input_ids) @ self.w  # [batch, key]

    def forward(self, input_ids, attention_mask=None):
        alpha = self.attention(input_ids, attention_mask)
        n = input_ids.shape[1]
        pattern = self.blocks[0].attn.hook_pattern(alpha[:, None, None, :].expand(-1, 1, n, n))
        return (pattern[:, 0, 0] * self.values(input_ids)).sum(-1, keepdim=True)  # [batch, 1]


@pytest.fixture
def pool():
    tok = WordTokenizer()
    torch.manual_seed(0)
    return track(KeyScorePool(len(tok)).eval()), tok


def by_name(result, example="0"):
    return {a.method: a for a in result.attributions if a.example_id == example}


def row(table, source, method, metric, example="0"):
    hit = table[(table.example_id == example) & (table.source == source)
                & (table.method == method) & (table.metric == metric)]
    assert len(hit) == 1, (source, method, metric, example)
    return hit.iloc[0]


def expected_scores(model, tok, text):
    """Hand-computed α, |saliency|, |input × gradient|, |leave-one-out| of KeyScorePool."""
    ids = tok([text])["input_ids"]
    with torch.no_grad():
        alpha = model.attention(ids)[0].double()
        v = model.values(ids)[0].double()
    y = float((alpha * v).sum())
    loo = y - (y - alpha * v) / (1 - alpha)
    loo[0] = 0.0  # [BOS] is never deleted
    return {"alpha": alpha, "saliency": alpha * float(model.w.detach().norm()),
            "input_x_gradient": (alpha * v).abs(), "leave_one_out": loo.abs()}


def test_attention_views_rank_like_saliency_by_construction(pool):
    model, tok = pool
    texts = [*TEXTS, "the cat saw the dog"]  # repeated 'the': tied in both, still tau = 1
    result = compare(model, tok, texts, "class:0", views=["raw", "rollout", "flow"],
                     methods=["saliency", "input_x_gradient", "leave_one_out"])
    table = result.table
    views = ("raw@L0", "rollout@L0", "flow@L0")
    assert set(table.source) == {*views, "saliency", "input_x_gradient"}
    for example in map(str, range(len(texts))):
        for view in views:
            assert row(table, view, "saliency", "kendall_tau", example).value == \
                pytest.approx(1.0, abs=1e-12)
            assert row(table, view, "saliency", "spearman", example).value == \
                pytest.approx(1.0, abs=1e-12)
            assert row(table, view, "saliency", "topk_overlap", example).value == 1.0
            assert row(table, view, "saliency", "jsd", example).value < 1e-12
    # the importance vectors themselves, against the hand computation
    for i, text in enumerate(texts):
        want = expected_scores(model, tok, text)
        got = by_name(result, str(i))
        torch.testing.assert_close(got["raw@L0"].scores, want["alpha"], atol=1e-6, rtol=0)
        torch.testing.assert_close(got["rollout@L0"].scores[1:], 0.5 * want["alpha"][1:],
                                   atol=1e-6, rtol=0)
        for method in ("saliency", "input_x_gradient", "leave_one_out"):
            torch.testing.assert_close(got[method].scores, want[method], atol=1e-6, rtol=1e-5)
    # where the ranks differ, the table holds scipy's value on the compared tokens
    want = expected_scores(model, tok, texts[1])
    for method in ("input_x_gradient", "leave_one_out"):
        tau = kendalltau(want["alpha"][1:], want[method][1:])
        got = row(table, "raw@L0", method, "kendall_tau", "1")
        assert got.value == pytest.approx(tau.statistic, abs=1e-9)
        assert got.p_value == pytest.approx(tau.pvalue, abs=1e-9)
        assert got.value < 1


def test_input_x_gradient_equals_the_attention_when_every_value_is_one(pool):
    model, tok = pool
    with torch.no_grad():  # w·e_j = 1 for every token: y = Σ α_j = 1, ∂y/∂e_j = α_j w
        model.embed.weight[:, 0] = 1.0
        model.w.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    result = compare(model, tok, TEXTS, "class:0", views=["raw", "rollout"],
                     methods=["saliency", "input_x_gradient"])
    rank = result.table[result.table.metric.isin(RANK_METRICS)]
    assert len(rank) == len(TEXTS) * (2 * 2 + 1) * 2  # 2 views x 2 methods + 1 pair; 2 metrics
    np.testing.assert_allclose(rank.value, 1.0, atol=1e-12)
    jsd = result.table[result.table.metric == "jsd"]
    assert (jsd.value < 1e-12).all()


def test_special_tokens_are_dropped_and_unk_is_kept(pool):
    model, tok = pool
    text = "the cat sat on a zyzzyva"  # an unknown word: [UNK], a word of the text
    want = expected_scores(model, tok, text)
    tokens = by_name(compare(model, tok, [text], "class:0", views=["raw"],
                             methods=["saliency"]))["saliency"].tokens
    assert tokens[0] == "[BOS]" and tokens[-1] == "[UNK]"

    dropped = compare(model, tok, [text], "class:0", views=["raw", "rollout"],
                      methods=["saliency", "input_x_gradient"]).table
    kept = compare(model, tok, [text], "class:0", views=["raw", "rollout"],
                   methods=["saliency", "input_x_gradient"], drop_special=False).table
    # rollout gives [BOS] 0.5 + 0.5·α_0 (the most), the attention gives it the least:
    # only with [BOS] left out do rollout and saliency rank alike
    assert row(dropped, "rollout@L0", "saliency", "kendall_tau").value == pytest.approx(1)
    alpha, sal = want["alpha"].clone(), want["saliency"]
    roll = 0.5 * alpha
    roll[0] += 0.5
    tau_all = kendalltau(roll, sal).statistic
    assert row(kept, "rollout@L0", "saliency", "kendall_tau").value == pytest.approx(tau_all)
    assert tau_all < 0.7
    assert row(kept, "raw@L0", "saliency", "kendall_tau").value == pytest.approx(1)
    # [UNK] is compared: the value is scipy's over every token but [BOS]
    with_unk = kendalltau(alpha[1:], want["input_x_gradient"][1:]).statistic
    without_unk = kendalltau(alpha[1:-1], want["input_x_gradient"][1:-1]).statistic
    assert abs(with_unk - without_unk) > 1e-3
    assert row(dropped, "raw@L0", "input_x_gradient", "kendall_tau").value == \
        pytest.approx(with_unk)


# ---------------------------------------------------------------------------- trained classifier
@pytest.fixture(scope="module")
def trained():
    """The reference Transformer classifier trained on ``contains`` (~2 s on one thread) and
    a comparison on held-out positives, whose decisive tokens are the ``key`` words."""
    train = make_examples("contains", 400, min_len=4, max_len=12, seed=1)
    held_out = make_examples("contains", 60, min_len=4, max_len=12, seed=2)
    model, tok = build_reference("transformer-classifier", seed=0)
    fit = train_classifier(model, tok, train, held_out=held_out, steps=60, batch_size=32,
                           lr=1e-2, seed=0)
    assert fit["held_out_accuracy"] >= 0.95
    positives = held_out.select([i for i in range(len(held_out))
                                 if held_out.labels[i] == 1][:8])
    result = compare(model, tok, positives.texts, "class:1", views=["raw", "rollout"],
                     methods=["integrated_gradients", "saliency", "input_x_gradient",
                              "leave_one_out"], truth=positives.decisive, n_steps=16)
    return track(model), tok, positives, result


def test_integrated_gradients_finds_the_key_tokens(trained):
    _, _, positives, result = trained
    truth = result.truth_table
    assert list(truth.columns) == list(TRUTH_COLUMNS)
    ig = truth[truth.source == "integrated_gradients"].set_index("metric").value
    assert ig.groupby(level=0).mean()["auroc"] >= 0.9
    assert ig.groupby(level=0).mean()["precision_at_k"] >= 0.75
    assert ig.groupby(level=0).mean()["mass_on_truth"] >= 0.6
    assert ig.groupby(level=0).size().eq(len(positives)).all()
    summary = result.truth_summary()
    ig_auroc = summary[(summary.source == "integrated_gradients") & (summary.metric == "auroc")]
    assert ig_auroc["mean"].item() == pytest.approx(ig["auroc"].mean())
    assert set(summary["source_kind"]) == {"attention", "attribution"}


def test_truth_given_over_all_tokens_or_the_words_is_the_same(trained):
    model, tok, positives, result = trained
    per_token = compare(model, tok, positives.texts[:3], "class:1", views=["raw"],
                        methods=["saliency"], truth=positives.token_decisive()[:3])
    words = result.truth_table[result.truth_table.source.isin(["raw@L0", "raw@L1", "saliency"])
                               & result.truth_table.example_id.isin(["0", "1", "2"])]
    pd.testing.assert_frame_equal(per_token.truth_table.reset_index(drop=True),
                                  words.reset_index(drop=True), check_exact=False)


def test_inverted_truth_mirrors_auroc(trained):
    model, tok, positives, _ = trained
    masks = positives.decisive[:4]
    straight = compare(model, tok, positives.texts[:4], "class:1", views=["rollout"],
                       methods=["saliency"], truth=masks).truth_table
    flipped = compare(model, tok, positives.texts[:4], "class:1", views=["rollout"],
                      methods=["saliency"], truth=[~m for m in masks]).truth_table
    a = straight[straight.metric == "auroc"].value.to_numpy()
    b = flipped[flipped.metric == "auroc"].value.to_numpy()
    np.testing.assert_allclose(a + b, 1.0, atol=1e-12)  # rank formula, ties averaged


def test_table_has_one_row_per_example_source_method_metric(trained):
    _, _, positives, result = trained
    table = result.table
    assert list(table.columns) == list(AGREEMENT_COLUMNS)
    methods = ["integrated_gradients", "saliency", "input_x_gradient", "leave_one_out"]
    views = [f"{v}@L{layer}" for v in ("raw", "rollout") for layer in (0, 1)]
    per_example = (len(views) * len(methods) + len(list(combinations(methods, 2))))
    assert len(table) == len(positives) * per_example * len(METRICS)
    assert not table.duplicated(["example_id", "source", "method", "metric"]).any()
    counts = table.groupby(["example_id", "source", "method"]).metric.apply(tuple)
    assert counts.map(lambda m: m == METRICS).all()
    attention = table[table.source_kind == "attention"]
    assert set(attention.source) == set(views)
    assert (attention.source == attention.view + "@L" + attention.layer.astype(str)).all()
    pairs = table[table.source_kind == "attribution"][["source", "method"]].drop_duplicates()
    assert [tuple(p) for p in pairs.to_numpy()] == list(combinations(methods, 2))
    assert table[table.source_kind == "attribution"].layer.isna().all()
    assert str(table.layer.dtype) == "Int64"


def test_values_and_p_values_are_in_range(trained):
    table = trained[3].table
    rank = table[table.metric.isin(RANK_METRICS)]
    assert rank.value.between(-1 - 1e-12, 1 + 1e-12).all()
    assert rank.p_value.notna().all() and rank.p_value.between(0, 1).all()
    other = table[~table.metric.isin(RANK_METRICS)]
    assert other.p_value.isna().all()
    assert other[other.metric == "topk_overlap"].value.between(0, 1).all()
    assert other[other.metric == "jsd"].value.between(0, math.log(2)).all()


def test_summary_is_the_mean_of_the_table(trained):
    table = trained[3].table
    summary = trained[3].summary()
    assert {"mean", "std", "n", "frac_significant"} <= set(summary.columns)
    assert len(summary) == len(table.groupby(["source", "method", "metric"]))
    for item in summary.itertuples():
        rows = table[(table.source == item.source) & (table.method == item.method)
                     & (table.metric == item.metric)]
        assert item.n == len(rows)
        assert item.mean == pytest.approx(rows.value.mean(), abs=1e-12)
        assert item.std == pytest.approx(rows.value.std(), abs=1e-12, nan_ok=True)
        if item.metric in RANK_METRICS:
            share = float((rows.p_value <= 0.05).mean())
            assert item.frac_significant == pytest.approx(share)
            assert 0 <= item.frac_significant <= 1
        else:
            assert math.isnan(item.frac_significant)
    attention = summary[summary.source_kind == "attention"]  # layers read in order per view
    assert attention.groupby("view").layer.apply(lambda s: s.is_monotonic_increasing).all()
    assert summary.source_kind.tolist() == sorted(summary.source_kind)


def test_tokens_of_views_and_methods_agree(trained):
    positives, result = trained[2:]
    for i, text in enumerate(positives.texts):
        items = [a for a in result.attributions if a.example_id == str(i)]
        assert len(items) == 4 + 4  # 4 methods, raw and rollout at 2 layers
        assert {a.tokens for a in items} == {("[BOS]", *text.split())}


# ---------------------------------------------------------------------------- tiny BERT
@pytest.fixture
def bert():
    return tiny_bert_classifier()


def test_every_row_is_scipys_value_on_the_non_special_tokens(bert):
    model, tok = bert
    texts = ["the big cat sat on a red mat", "a dog ran on the zebra mat"]  # zebra: [UNK]
    result = compare(model, tok, texts, "class:1", methods=["integrated_gradients", "saliency",
                                                            "leave_one_out"], n_steps=8)
    assert set(result.table.view) >= {"raw", "rollout", "attn_x_grad", "norm"}
    scores = {(a.example_id, a.method): a for a in result.attributions}
    for item in result.table.itertuples():
        a, b = scores[(item.example_id, item.source)], scores[(item.example_id, item.method)]
        assert a.tokens == b.tokens and a.tokens[0] == "[CLS]" and a.tokens[-1] == "[SEP]"
        keep = np.array([t not in ("[CLS]", "[SEP]") for t in a.tokens])
        x, y = a.scores.numpy()[keep], b.scores.numpy()[keep]
        if item.metric == "kendall_tau":
            want, p = kendalltau(x, y)
        elif item.metric == "spearman":
            want, p = spearmanr(x, y)
        elif item.metric == "topk_overlap":
            k, p = max(1, round(0.2 * len(x))), None
            top_x, top_y = (set(np.argsort(-np.abs(v), kind="stable")[:k]) for v in (x, y))
            want = len(top_x & top_y) / k
        else:
            want, p = jensenshannon(np.abs(x), np.abs(y)) ** 2, None
        assert item.value == pytest.approx(want, abs=1e-9), item
        if p is not None:
            assert item.p_value == pytest.approx(p, abs=1e-9)
    assert "[UNK]" in scores[("1", "saliency")].tokens
    assert (result.table.groupby("example_id").size() > 0).all()


# ---------------------------------------------------------------------------- targets
def test_next_token_on_a_tiny_causal_model():
    model, tok = ap.load_model("ref:transformer")
    track(model)
    texts = ["the cat sat on the mat", "a dog ran to the"]
    result = compare(model, tok, texts, "next-token", views=["raw", "rollout", "attn_x_grad"],
                     methods=["saliency", "leave_one_out"], query="last")
    for i, text in enumerate(texts):
        batch = tok([text])
        with torch.no_grad():
            top = int(model(**batch)[0, -1].argmax())
        items = by_name(result, str(i))
        assert {items[m].target for m in ("saliency", "leave_one_out", "attn_x_grad")} == \
            {f"next-token:{top}"}  # the views explain the token the methods fixed
        assert {a.tokens for a in items.values()} == {tuple(tok.convert_ids_to_tokens(
            batch["input_ids"][0].tolist()))}
    assert {"raw@L0", "raw@L1", "rollout@L1", "attn_x_grad"} <= set(result.table.source)
    rank = result.table[result.table.metric.isin(RANK_METRICS)]
    assert rank.p_value.between(0, 1).all()


def test_a_callable_target_works(pool):
    model, tok = pool
    result = compare(model, tok, TEXTS[:1], lambda output, inputs: output[:, 0],
                     views=["raw"], methods=["saliency"])
    assert row(result.table, "raw@L0", "saliency", "kendall_tau").value == pytest.approx(1)
    assert by_name(result)["saliency"].target == "custom"


# ---------------------------------------------------------------------------- errors
def test_truth_with_the_wrong_length_is_refused(pool):
    model, tok = pool
    with pytest.raises(InputError, match="truth has 1 entries for 2 texts"):
        compare(model, tok, TEXTS[:2], "class:0", views=["raw"], methods=["saliency"],
                truth=[[True, False]])
    with pytest.raises(InputError, match=r"example 0: truth has 3 entries but the text has 7 "
                                         r"tokens \(6 without special tokens\)"):
        compare(model, tok, TEXTS[:1], "class:0", views=["raw"], methods=["saliency"],
                truth=[[True, False, False]])
    plain = compare(model, tok, TEXTS[:1], "class:0", views=["raw"], methods=["saliency"])
    assert plain.truth_table.empty
    with pytest.raises(InputError, match="no ground truth was given"):
        plain.truth_summary()


@pytest.mark.parametrize(("options", "message"), [
    ({"methods": []}, "at least one attribution method"),
    ({"methods": ["saliency", "deeplift"]}, "'deeplift'"),
    ({"views": ["raw", "attention"]}, "views must be distinct names"),
    ({"scope": "layer:3"}, r"layers \[3\] out of range"),
    ({"target": "class:4"}, None),
])
def test_bad_requests_are_input_errors(pool, options, message):
    model, tok = pool
    options = {"views": ["raw"], "methods": ["saliency"], "target": "class:0", **options}
    target = options.pop("target")
    if message is None:  # KeyScorePool declares no class count: checked on the output
        with pytest.raises(InputError, match="target class 4 out of range"):
            compare(model, tok, TEXTS[:1], target, **options)
        return
    with pytest.raises(InputError, match=message):
        compare(model, tok, TEXTS[:1], target, **options)


def test_texts_are_checked(pool):
    model, tok = pool
    with pytest.raises(InputError, match="no text given"):
        compare(model, tok, [], "class:0", views=["raw"], methods=["saliency"])
    with pytest.raises(InputError, match="fewer than two tokens"):
        compare(model, tok, ["cat"], "class:0", views=["raw"], methods=["saliency"])
