"""``faithfulness.evaluate`` against closed forms on a bag-of-words classifier, and against
one forward per perturbed input on tiny transformers.

On :class:`BagOfWords` the class-1 logit is ``Σ_j w[id_j]`` over the tokens the model sees,
so deleting a set ``R`` of real tokens lowers it by exactly ``Σ_{j∈R} w_j``. A *planted*
method that scores each token by its own weight is the best possible ranking: its
comprehensiveness at ``k`` tokens is the sum of the ``k`` largest weights, its sufficiency
the sum of the others, and leave-one-out ranks the tokens exactly as it does (τ = 1). The
model runs in float32; a sum of ``m`` terms is exact to ``m · eps32 · Σ|w|`` (recursive
summation), which gives the tolerances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

from attnprobe.attribution.method_base import Explanation, Problem
from attnprobe.attribution.views import attention_importance
from attnprobe.errors import InputError
from attnprobe.faithfulness import FaithfulnessOptions, bootstrap_ci, evaluate
from attnprobe.faithfulness.sanity import randomized_copy
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert_classifier
from tests.unit.faithfulness.bag_of_words import VOCAB, BagOfWords, weights

WORDS = "the cat sat on a mat dog ran big red fox"  # ids 5..15, as BagOfWords' words
EPS32 = float(np.finfo(np.float32).eps)
LEVELS = (0.1, 0.25, 0.5)


@dataclass(frozen=True)
class Planted:
    """Scores each token by a fixed weight of its id: the model's own weights (the ideal
    explanation) or any other table; it never looks at the model."""

    table: torch.Tensor
    name: ClassVar[str] = "planted"
    summary: ClassVar[str] = "fixed weight per token id"
    knob: ClassVar[str | None] = None

    def cost(self, n_tokens: int) -> int:
        return 0

    def explain(self, problem: Problem) -> Explanation:
        return Explanation(self.table[problem.ids[0]].double())


@dataclass(frozen=True)
class Other(Planted):
    """A second planted table under its own name (a source name is given once)."""

    name: ClassVar[str] = "other"


class Counting(torch.nn.Module):
    """BagOfWords that records every input row it runs (for the deduplication test)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.rows: list[tuple[int, ...]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            self.rows.append(tuple(i for i, m in zip(ids, mask, strict=True) if m))
        return self.inner(input_ids, attention_mask)


@pytest.fixture(scope="module")
def tok():
    vocab = bert_vocab(WORDS)
    assert len(vocab) == VOCAB
    return bert_tokenizer(vocab)


@pytest.fixture(scope="module")
def bow():
    return BagOfWords(weights(0)).eval()


def _texts(n: int, length: int, seed: int = 3) -> list[str]:
    rng = np.random.default_rng(seed)
    words = WORDS.split()
    return [" ".join(rng.choice(words, size=length, replace=False)) for _ in range(n)]


def _word_weights(model: BagOfWords, tok, text: str) -> np.ndarray:
    ids = tok(text)["input_ids"][1:-1]  # the real tokens, without [CLS] and [SEP]
    return model.w.detach().double().numpy()[ids]


def _counts(n: int, levels=LEVELS) -> list[int]:
    return [min(n - 1, max(1, math.floor(level * n + 0.5))) for level in levels]


def _trapezoid(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def _values(result, source: str, metric: str, example: str = "0") -> np.ndarray:
    t = result.table
    rows = t[(t["source"] == source) & (t["metric"] == metric) & (t["example_id"] == example)]
    return rows["value"].to_numpy()


def test_planted_ranking_gives_the_closed_forms(bow, tok):
    texts = _texts(3, 8)
    result = evaluate(bow, tok, texts, "class:1", methods=[Planted(bow.w.detach())], views=[],
                      levels=LEVELS, curve_steps=None)
    for example, text in enumerate(texts):
        w = _word_weights(bow, tok, text)
        top = np.sort(w)[::-1]
        counts = _counts(len(w))
        tol = 4 * len(w) * EPS32 * (np.abs(w).sum() + 0.5)
        comp = [top[:k].sum() for k in counts]
        suff = [top[k:].sum() for k in counts]
        got = _values(result, "planted", "comprehensiveness", str(example))
        np.testing.assert_allclose(got, comp, atol=tol)
        np.testing.assert_allclose(_values(result, "planted", "sufficiency", str(example)),
                                   suff, atol=tol)
        np.testing.assert_allclose(
            _values(result, "planted", "aopc_comprehensiveness", str(example)),
            [np.mean(comp)], atol=tol)
        # deletion most-relevant-first: the logit after removing the top k is S - top[:k]
        n = len(w)
        morf = np.array([-top[:k].sum() for k in range(n + 1)])
        lerf = np.array([-top[::-1][:k].sum() for k in range(n + 1)])
        x = np.arange(n + 1) / n
        area = _values(result, "planted", "deletion_morf_area", str(example))[0]
        shift = area - _trapezoid(x, morf)
        # the curves hold the logit itself: S + 0.5 ([CLS], [SEP]) at every point
        assert shift == pytest.approx(w.sum() + 0.5, abs=tol)
        assert _values(result, "planted", "abpc", str(example))[0] == pytest.approx(
            _trapezoid(x, lerf) - _trapezoid(x, morf), abs=tol)
        # insertion: only the top (or bottom) k kept, so the logit is their sum + 0.5
        for curve, kept in (("insertion_morf", top), ("insertion_lerf", top[::-1])):
            values = np.array([kept[:k].sum() + 0.5 for k in range(n + 1)])
            assert _values(result, "planted", f"{curve}_area", str(example))[0] == \
                pytest.approx(_trapezoid(x, values), abs=tol)
        assert _values(result, "planted", "tau_loo", str(example))[0] == pytest.approx(1.0)
    assert set(result.table["removal"]) == {"delete"}
    assert set(result.table["target"]) == {"class:1"}


def test_the_planted_ranking_beats_the_random_baseline(bow, tok):
    result = evaluate(bow, tok, _texts(12, 9), "class:1", methods=[Planted(bow.w.detach())],
                      views=[], levels=LEVELS)
    summary = result.summary().set_index("source")
    assert summary.loc["planted", "aopc_comprehensiveness"] > \
        summary.loc["random", "aopc_comprehensiveness"]
    assert summary.loc["planted", "aopc_sufficiency"] < summary.loc["random", "aopc_sufficiency"]
    assert summary.loc["planted", "rank"] == 1
    assert summary.loc["random", "source_kind"] == "random"
    # the summary's interval is the bootstrap of the per-example values in the table
    t = result.table
    per = t[(t["source"] == "planted") & (t["metric"] == "abpc")]["value"].to_numpy()
    mean, low, high = bootstrap_ci(per, seed=result.seed)
    assert (summary.loc["planted", "abpc"], summary.loc["planted", "abpc_low"],
            summary.loc["planted", "abpc_high"]) == pytest.approx((mean, low, high))


def test_each_distinct_input_runs_once(bow, tok):
    """Across sources, levels, curves and repeated texts every distinct input is run once:
    the rows the model sees are exactly the distinct inputs enumerated here by hand."""
    counting = Counting(bow).eval()
    text = _texts(1, 6)[0]
    ids = tok(text)["input_ids"]
    reverse = Other(-bow.w.detach())
    evaluate(counting, tok, [text, text], "class:1", views=[], levels=LEVELS, curve_steps=None,
             methods=[Planted(bow.w.detach()), reverse])
    real = list(range(1, len(ids) - 1))
    w = bow.w.detach().numpy()
    best = sorted(real, key=lambda p: -w[ids[p]])
    rng = np.random.default_rng(0)  # the random baseline of text 0 (seed 0 + 0) ...
    orders = [best, best[::-1], list(rng.permutation(real)),
              list(np.random.default_rng(1).permutation(real))]  # ... and of text 1
    wanted = {tuple(ids)} | {tuple(i for p, i in enumerate(ids) if p != j) for j in real}
    for order in orders:
        for k in range(len(real) + 1):
            wanted.add(tuple(i for p, i in enumerate(ids) if p not in set(order[:k])))
            wanted.add(tuple(i for p, i in enumerate(ids) if p not in set(order[k:])))
    # each once, nothing else, besides the forward on the full text that fixes the target
    # of each text before its methods run
    assert sorted(counting.rows) == sorted([*wanted, tuple(ids), tuple(ids)])


def test_constant_importance_and_short_texts_give_noted_nan_rows(bow, tok):
    flat = Other(torch.ones(VOCAB))
    result = evaluate(bow, tok, ["the cat sat on", "fox"], "class:1",
                      methods=[flat, Planted(bow.w.detach())], views=[], levels=LEVELS)
    t = result.table
    flat_rows = t[(t["source"] == "other") & (t["example_id"] == "0")]
    # the constant one gets NaN rows with the note, every one of them; the other has values
    assert flat_rows["value"].isna().all()
    assert flat_rows["note"].str.contains("constant").all()
    planted = t[(t["source"] == "planted") & (t["example_id"] == "0")]
    assert planted["value"].notna().all()
    short = t[t["example_id"] == "1"]
    assert short["value"].isna().all()
    assert short["note"].str.contains("at least 2 real tokens").all()


@pytest.mark.parametrize("removal", ["attention", "delete"])
def test_a_removal_that_hides_every_token_gives_noted_nan_rows(bow, tok, removal):
    """Without special tokens, the curves' end points (every token removed) leave the model
    nothing to see: the curve areas are NaN with the reason, never a number, while the
    removal levels (at least one token kept) keep their values."""
    ids = tok("the cat sat on", add_special_tokens=False)["input_ids"]
    result = evaluate(bow, tok, [ids], "class:1", methods=[Planted(bow.w.detach())], views=[],
                      levels=LEVELS, removal=removal, curve_steps=2)
    planted = result.table[result.table["source"] == "planted"].set_index("metric")
    for metric in ("deletion_morf_area", "insertion_morf_area", "insertion_lerf_area", "abpc"):
        assert np.isnan(planted.loc[metric, "value"])
        assert "no token to see" in planted.loc[metric, "note"]
    w = bow.w.detach().double().numpy()[ids]
    top = np.sort(w)[::-1]
    want = [top[:k].sum() for k in _counts(len(w))]
    got = planted.loc["comprehensiveness", "value"].to_numpy()
    np.testing.assert_allclose(got, want, atol=4 * len(w) * EPS32 * np.abs(w).sum())


def test_refusals(bow, tok):
    method = [Planted(bow.w.detach())]
    with pytest.raises(InputError, match="share in"):
        evaluate(bow, tok, ["the cat"], "class:1", methods=method, views=[], levels=(0.0,))
    with pytest.raises(InputError, match="removal must be one of"):
        evaluate(bow, tok, ["the cat"], "class:1", methods=method, views=[], removal="drop")
    with pytest.raises(InputError, match="at least one"):
        evaluate(bow, tok, ["the cat"], "class:1", methods=[], views=[])
    with pytest.raises(InputError, match="budget"):
        evaluate(bow, tok, ["the cat sat on a mat"], "class:1", methods=method, views=[],
                 budget=50)
    with pytest.raises(InputError, match="unknown option"):
        evaluate(bow, tok, ["the cat"], "class:1", methods=method, views=[], steps=3)
    bow.train()
    try:
        with pytest.raises(InputError, match="training mode"):
            evaluate(bow, tok, ["the cat"], "class:1", methods=method, views=[])
    finally:
        bow.eval()
    with torch.inference_mode(), pytest.raises(InputError, match="inference_mode"):
        evaluate(bow, tok, ["the cat"], "class:1", methods=method, views=[])
    with pytest.raises(InputError, match="sanity_threshold"):
        FaithfulnessOptions(sanity_threshold=2.0)


def _removed_logit(model, tok, ids: torch.Tensor, drop: list[int], removal: str) -> float:
    """The class-1 logit of one forward of ``ids`` with ``drop`` removed by hand."""
    keep = [p for p in range(len(ids)) if p not in drop]
    if removal == "delete":
        x, m = ids[keep], torch.ones(len(keep), dtype=torch.long)
    elif removal == "replace":
        x = ids.clone()
        x[drop] = tok.mask_token_id
        m = torch.ones_like(ids)
    else:
        x, m = ids, torch.tensor([0 if p in drop else 1 for p in range(len(ids))])
    with torch.no_grad():
        return float(model(input_ids=x[None], attention_mask=m[None]).logits[0, 1])


@pytest.mark.parametrize("removal", ["delete", "replace", "attention"])
def test_batched_outputs_equal_one_forward_per_input(removal):
    """On a tiny BERT the pooled, padded batches give what one forward of each perturbed
    input gives on its own (the top-k tokens of the source removed by hand)."""
    model, tok = tiny_bert_classifier(WORDS)
    texts = ["the cat sat on a mat", "a big red dog ran", "the fox sat"]
    result = evaluate(model, tok, texts, "class:1", methods=["saliency"], views=["raw"],
                      levels=LEVELS, removal=removal, curve_steps=4)
    assert set(result.table["removal"]) == {"replace:[MASK]" if removal == "replace"
                                            else removal}
    t = result.table
    for example, text in enumerate(texts):
        ids = tok(text, return_tensors="pt")["input_ids"][0]
        raw = t[(t["example_id"] == str(example)) & (t["source"] == "raw@L1")]
        scores = attention_importance(model, tok, text, views=["raw"], scope="layer:1")[0]
        real = list(range(1, len(ids) - 1))
        order = sorted(real, key=lambda p, s=scores.scores: (-float(s[p]), p))
        full = _removed_logit(model, tok, ids, [], removal)
        want = [full - _removed_logit(model, tok, ids, order[:k], removal)
                for k in _counts(len(real))]
        got = raw[raw["metric"] == "comprehensiveness"]["value"].to_numpy()
        # padded batch vs one input: float32 sums over the width-16 model, a few ulps of the
        # logits at each of 2 layers
        np.testing.assert_allclose(got, want, atol=64 * EPS32 * (1 + abs(full)))


def test_a_causal_model_keeps_the_explained_position():
    """With next-token on GPT-2 the last token (where the prediction is read) is never
    removed; the comprehensiveness equals one forward with the top tokens deleted."""
    import transformers

    from tests.conftest import track
    vocab = bert_vocab(WORDS)
    tok = bert_tokenizer(vocab)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=2, n_head=2,
                                     n_positions=32)
    lm = track(transformers.GPT2LMHeadModel(config).eval())
    ids = torch.tensor(tok("the cat sat on a mat dog", add_special_tokens=False)["input_ids"])
    result = evaluate(lm, tok, [ids.tolist()], "next-token", views=[], levels=(0.5,),
                      methods=[Planted(torch.arange(VOCAB).double())])
    # ranked: every position but the last, by id (the planted table is the id)
    ranked = sorted(range(len(ids) - 1), key=lambda p: (-int(ids[p]), p))
    n_real = len(ranked)
    k = _counts(n_real, (0.5,))[0]
    with torch.no_grad():
        logits = lm(input_ids=ids[None]).logits[0, -1]
        token = int(logits.argmax())
        keep = [p for p in range(len(ids)) if p not in ranked[:k]]
        cut = lm(input_ids=ids[keep][None]).logits[0, -1, token]
    got = _values(result, "planted", "comprehensiveness")[0]
    assert got == pytest.approx(float(logits[token] - cut), abs=64 * EPS32 * float(
        logits.abs().max()))
    assert result.table["target"].iloc[0] == f"next-token:{token}"


def test_sanity_check_flags_an_explanation_that_ignores_the_model():
    model, tok = tiny_bert_classifier(WORDS)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = evaluate(model, tok, ["the cat sat on a mat", "a big red dog ran"], "class:1",
                      methods=[Planted(torch.arange(VOCAB).double()), "saliency"], views=[],
                      levels=LEVELS, sanity=True, randomize=1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    summary = result.summary().set_index("source")
    assert summary.loc["planted", "sanity_spearman"] == pytest.approx(1.0)
    assert bool(summary.loc["planted", "sanity_flag"])
    # the copy: the top layer re-initialised, the layer below and the embeddings kept
    copy = randomized_copy(model, 1, seed=0)
    assert torch.equal(copy.bert.encoder.layer[0].attention.self.query.weight,
                       model.bert.encoder.layer[0].attention.self.query.weight)
    assert not torch.equal(copy.bert.encoder.layer[1].attention.self.query.weight,
                           model.bert.encoder.layer[1].attention.self.query.weight)
    with pytest.raises(InputError, match="randomize=3"):
        randomized_copy(model, 3)


def test_a_reference_model_is_randomised_through_its_anatomy():
    import attnprobe as ap

    lm, _ = ap.load_model("ref:induction")
    copy = randomized_copy(lm, 1, seed=0)
    for name, weight in lm.named_parameters():
        other = dict(copy.named_parameters())[name]
        # the top block's projections are redrawn; everything below and around it is kept
        assert torch.equal(weight, other) != (name.startswith("blocks.1.attn."))
