"""``ap.perturb.run``: every experiment on small models, the tidy columns, batched draws equal
to sequential ones, reproducibility from the seed, and one clear error per bad input."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from torch import nn

import attnprobe as ap
from attnprobe.errors import AttentionUnavailableError, EditNotAppliedError, InputError
from attnprobe.models import build_reference
from attnprobe.perturb import Permute, Scope, Zero, perturbed, tvd
from attnprobe.perturb.experiments import EXPERIMENTS, RUN_COLUMNS, run
from attnprobe.perturb.job import generator_for
from tests.conftest import track

TEXTS = ["the cat sat on the red mat", "a dog ran to the big tree", "the bird saw a fish"]
WORDS = "the cat sat on mat a dog ran big red tree".split()
VOCAB = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
HF_TEXTS = ["the cat sat on the mat", "a dog ran"]
# Two batchings of the same float32 forwards agree to what float32 guarantees: relative
# 1e-5 (sums in another order, ~8 ulps per layer), and, for a distance between two outputs
# (tvd, jsd ...), an absolute 1e-6: it inherits the outputs' own rounding (~1e-7 per
# probability), however small the distance itself is (0.0097 differed by 2.4e-8).
BATCHED = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def classifier():
    model, tok = build_reference("transformer-classifier")  # 2 layers x 2 heads
    return track(model), tok


@pytest.fixture(scope="module")
def bilstm():
    model, tok = build_reference("bilstm-classifier")  # one additive attention, one row
    return track(model), tok


@pytest.fixture(scope="module")
def hf_tok():
    return transformers.BertTokenizerFast(vocab=VOCAB, do_lower_case=True)


def tiny_bert_config(**kw) -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=32,
                                   max_position_embeddings=64, initializer_range=0.3, **kw)


def check_table(table: pd.DataFrame, params: tuple[str, ...] | None = None) -> None:
    """RUN_COLUMNS first, then the parameter columns (exactly ``params`` when given)."""
    assert tuple(table.columns[:len(RUN_COLUMNS)]) == RUN_COLUMNS
    if params is not None:
        assert tuple(table.columns) == RUN_COLUMNS + params
    for column in ("layer", "head", "step"):
        assert table[column].dtype == "Int64", column
    finite = table.dropna(subset=["perturbed"])
    assert ((finite["perturbed"] - finite["baseline"]) == finite["change"]).all()


def params_at(table: pd.DataFrame, row: int) -> dict:
    """The parameter columns of one row that hold a value."""
    values = table.iloc[row][list(table.columns[len(RUN_COLUMNS):])]
    return {k: v for k, v in values.items() if not pd.isna(v)}


# ----------------------------------------------------------------------------- one edit
def test_uniform_on_the_transformer_classifier_gives_finite_tvd_in_0_1(classifier):
    model, tok = classifier
    table = run(model, tok, TEXTS, "uniform")
    check_table(table)
    assert set(table["experiment"]) == {"uniform"} and set(table["perturbation"]) == {"uniform"}
    assert table["example_id"].unique().tolist() == ["0", "1", "2"]
    assert table["step"].isna().all() and set(table["scope"]) == {"all"}
    assert table["layer"].isna().all() and table["head"].isna().all()  # several heads
    assert set(table["metric"]) == {"tvd", "jsd", "flip", "top_prob"}
    values = table.set_index(["example_id", "metric"])["perturbed"]
    distance = values.xs("tvd", level="metric")
    assert distance.map(math.isfinite).all()
    assert ((distance > 0) & (distance <= 1)).all()
    assert (values.xs("jsd", level="metric") <= math.log(2)).all()


def test_zero_ablating_every_head_of_every_layer_changes_the_output(classifier, bilstm):
    for model, tok in (classifier, bilstm):
        table = run(model, tok, TEXTS, "ablate")
        check_table(table, ())  # no options, no parameter columns
        changes = table[table["metric"] == "tvd"]["perturbed"]
        assert len(changes) == len(TEXTS) and (changes > 1e-6).all()
    # the same number as the building block gives by hand
    model, tok = classifier
    batch = tok(TEXTS[:1])
    with torch.no_grad():
        before = model(**batch).softmax(-1)
        with perturbed(model, Zero(), Scope()):
            after = model(**batch).softmax(-1)
    first = run(model, tok, TEXTS[:1], "ablate").set_index("metric")["perturbed"]
    assert first["tvd"] == pytest.approx(float(tvd(before, after)[0]), abs=1e-6)


def test_scope_limits_the_edit_and_is_reported(classifier):
    model, tok = classifier
    one = run(model, tok, TEXTS[:1], "uniform", scope="head:1.0")
    assert set(one["scope"]) == {"head:1.0"}
    assert set(one["layer"]) == {1} and set(one["head"]) == {0}  # one head: both integers
    layer = run(model, tok, TEXTS[:1], "uniform", scope="layer:1")
    assert set(layer["layer"]) == {1} and layer["head"].isna().all()
    every = run(model, tok, TEXTS[:1], "uniform", scope=Scope())
    one_tvd = one.set_index("metric").loc["tvd", "perturbed"]
    assert one_tvd != every.set_index("metric").loc["tvd", "perturbed"]


# ----------------------------------------------------------------------------- permutations
def test_permute_rows_are_summaries_over_the_permutations_and_max_attention(bilstm):
    model, tok = bilstm
    table = run(model, tok, TEXTS, "permute", n_permutations=20)
    check_table(table, ("n_permutations", "seed"))
    # the J&W BiLSTM has one attention head: the whole scope is that head
    assert set(table["layer"]) == {0} and set(table["head"]) == {0}
    metrics = [f"{m}_{s}" for m in ("tvd", "jsd", "flip") for s in ("median", "mean", "max")]
    assert table[table["example_id"] == "0"]["metric"].tolist() == [*metrics, "max_attention"]
    assert params_at(table, 0) == {"n_permutations": 20, "seed": 0}
    assert table["n_permutations"].dtype == "Int64" and table["seed"].dtype == "Int64"
    wide = table.pivot(index="example_id", columns="metric", values="perturbed")
    assert ((wide["tvd_median"] <= wide["tvd_max"]) & (wide["tvd_mean"] <= wide["tvd_max"])).all()
    assert (wide["tvd_max"] > 0).all() and (wide["tvd_max"] <= 1).all()
    # one attention row per example: max_attention is its largest weight, and a permutation
    # keeps the multiset of weights, hence the maximum
    att = table[table["metric"] == "max_attention"]
    assert ((att["baseline"] > 0) & (att["baseline"] <= 1)).all()
    assert att["change"].abs().max() < 1e-6
    with torch.no_grad(), ap.capture(model) as cap:
        model(**tok(TEXTS[:1]))
    assert att["baseline"].iloc[0] == pytest.approx(float(cap.maps[0].pattern.max()), abs=1e-6)


def uniform_first_layer(seed: int = 0):
    """A transformer classifier whose layer-0 queries are zero: every layer-0 row is exactly
    uniform over its keys."""
    model, tok = build_reference("transformer-classifier", seed=seed)
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.zero_()
        model.blocks[0].attn.q_proj.bias.zero_()
    return track(model), tok


def test_permuting_a_uniform_head_reports_exactly_zero_change():
    model, tok = uniform_first_layer()
    table = run(model, tok, TEXTS, "permute", scope="layer:0", n_permutations=10)
    check_table(table)
    distances = table[table["metric"] != "max_attention"]
    assert (distances["perturbed"] == 0).all() and (distances["change"] == 0).all()
    att = table[table["metric"] == "max_attention"]
    assert (att["baseline"] == att["perturbed"]).all()
    # ... while a layer that is not uniform still moves
    other = run(model, tok, TEXTS, "permute", scope="layer:1", n_permutations=10)
    assert (other[other["metric"] == "tvd_max"]["perturbed"] > 0).all()


def test_uniform_on_an_already_uniform_head_is_a_clear_error_not_a_silent_no_op():
    model, tok = uniform_first_layer()
    with pytest.raises(EditNotAppliedError, match=r"perturb uniform \(text 0.*layer:0.*"
                                                  r"uniform changed no attention weight"):
        run(model, tok, TEXTS[:1], "uniform", scope="layer:0")


def test_batched_permutations_equal_sequential_ones_for_the_same_seed(classifier):
    model, tok = classifier
    n = 12
    batched = run(model, tok, TEXTS[:2], "permute", n_permutations=n)
    for size in (1, 5):
        pd.testing.assert_frame_equal(
            run(model, tok, TEXTS[:2], "permute", n_permutations=n, batch_size=size), batched,
            **BATCHED)
    # permutation j of example i is the building block perturbed() with its own generator,
    # one forward of batch 1 each (both layers in scope)
    batch = tok(TEXTS[1:2])
    with torch.no_grad():
        before = model(**batch).softmax(-1)
        changes = []
        for j in range(n):
            with perturbed(model, Permute(), Scope(), generator=generator_for(0, 0, 1, j)):
                changes.append(float(tvd(before, model(**batch).softmax(-1))[0]))
    row = batched[batched["example_id"] == "1"].set_index("metric")["perturbed"]
    expected = torch.tensor(changes, dtype=torch.float64)
    assert row["tvd_max"] == pytest.approx(float(expected.max()), abs=1e-6)
    assert row["tvd_mean"] == pytest.approx(float(expected.mean()), abs=1e-6)
    assert row["tvd_median"] == pytest.approx(float(np.median(changes)), abs=1e-6)


@pytest.mark.parametrize(("experiment", "kw"), [
    ("permute", {"n_permutations": 8}),
    ("dirichlet", {"n_draws": 8, "alpha": 0.5}),
    ("erase", {"max_erased": 2, "rankings": ("attention", "random")}),
])
def test_the_same_call_twice_gives_an_identical_table(classifier, experiment, kw):
    model, tok = classifier
    first = run(model, tok, TEXTS, experiment, seed=3, **kw)
    pd.testing.assert_frame_equal(run(model, tok, TEXTS, experiment, seed=3, **kw), first,
                                  check_exact=True)
    if experiment != "erase" or kw["rankings"] == ("attention",):
        return
    other = run(model, tok, TEXTS, experiment, seed=4, **kw)
    assert not other.equals(first)  # the seed is what fixes the draws


def test_dirichlet_draws_change_the_weights_and_report_alpha(classifier):
    model, tok = classifier
    table = run(model, tok, TEXTS[:1], "dirichlet", n_draws=6, alpha=0.1)
    check_table(table, ("n_draws", "alpha", "seed"))
    assert params_at(table, 0) == {"alpha": 0.1, "n_draws": 6, "seed": 0}
    assert table["alpha"].dtype == "float64"
    att = table.set_index("metric").loc["max_attention"]
    assert att["perturbed"] > att["baseline"]  # alpha < 1 draws peaked rows


# ----------------------------------------------------------------------------- erasure
def test_erase_reports_steps_and_the_fraction_before_the_decision_flips(classifier):
    model, tok = classifier
    table = run(model, tok, TEXTS[:2], "erase", max_erased=2,
                rankings=("attention", "saliency", "random"))
    check_table(table, ("max_erased", "n_steps", "seed", "ranking", "n_keys"))
    steps = table.dropna(subset=["step"])
    assert sorted(steps["step"].unique().tolist()) == [1, 2]
    assert set(steps["metric"]) == {"tvd", "jsd", "flip", "top_prob"}
    assert set(steps["max_erased"]) == {2} and set(steps["seed"]) == {0}
    assert steps["n_keys"].isna().all()  # a detail of the summary rows only
    summary = table[table["step"].isna()]
    assert set(summary["metric"]) == {"flipped", "fraction_to_flip"}
    for (_, _, n), group in summary.groupby(["example_id", "ranking", "n_keys"]):
        flipped, fraction = group.set_index("metric")["perturbed"][["flipped",
                                                                     "fraction_to_flip"]]
        if flipped:
            assert 0 < fraction <= (n - 1) / n
        else:
            assert math.isnan(fraction)
    assert len(summary) == 2 * 3 * 2  # every (text, ranking) has its n_keys
    assert set(table["ranking"]) == {"attention", "saliency", "random"}


def test_erase_with_integrated_gradients_by_default_on_the_bilstm(bilstm):
    model, tok = bilstm
    table = run(model, tok, TEXTS[:1], "erase")
    assert set(table["ranking"]) == {"attention", "integrated_gradients", "random"}
    # [BOS] gets no attention in the J&W classifier, so it is not an erasable key
    assert set(table[table["step"].isna()]["n_keys"]) == {len(TEXTS[0].split())}


# ----------------------------------------------------------------------------- adversarial
def test_adversarial_reports_jsd_within_eps_per_example_and_layer(bilstm):
    model, tok = bilstm
    table = run(model, tok, TEXTS[:2], "adversarial", eps=0.05, steps=15, n_adversaries=2)
    check_table(table, ("eps", "n_adversaries", "steps", "lr", "seed"))
    assert set(table["scope"]) == {"layer:0"} and set(table["layer"]) == {0}
    assert params_at(table, 0) == {"eps": 0.05, "lr": 0.01, "n_adversaries": 2, "seed": 0,
                                   "steps": 15}
    for _, group in table.groupby("example_id"):
        value = group.set_index("metric")["perturbed"]
        assert value["within_eps"] in (0.0, 1.0)
        if value["within_eps"]:
            assert 0 <= value["jsd"] <= math.log(2) + 1e-6 and value["tvd"] <= 0.05
        else:
            assert math.isnan(value["jsd"]) and value["tvd"] > 0.05


# ----------------------------------------------------------------------------- importance
def test_importance_scores_heads_and_prunes_in_increasing_importance(classifier):
    model, tok = classifier
    table = run(model, tok, TEXTS, "importance")
    check_table(table, ("prune_steps", "estimate", "normalised", "order", "pruned"))
    heads = table[table["metric"] == "importance"]
    assert sorted(heads["scope"]) == ["head:0.0", "head:0.1", "head:1.0", "head:1.1"]
    assert sorted(zip(heads["layer"], heads["head"], strict=True)) == [(0, 0), (0, 1), (1, 0),
                                                                       (1, 1)]
    assert (heads["example_id"] == "all").all() and (heads["perturbed"] >= 0).all()
    curve = table.dropna(subset=["step"])
    assert sorted(curve["step"].unique().tolist()) == [1, 2, 3, 4]
    assert set(curve["metric"]) == {"agreement", "tvd", "jsd", "flip"}
    first = curve[curve["step"] == 1]["pruned"].iloc[0]
    least = heads.sort_values("perturbed").iloc[0]
    assert first == f"L{least['layer']}H{least['head']}"
    assert curve["layer"].isna().all() and curve["prune_steps"].isna().all()  # None: NA
    agreement = curve[curve["metric"] == "agreement"]
    assert (agreement["baseline"] == 1.0).all()
    scoped = run(model, tok, TEXTS, "importance", scope="layer:1")
    assert set(scoped[scoped["metric"] == "importance"]["scope"]) == {"head:1.0", "head:1.1"}


# ----------------------------------------------------------------------------- output kinds
def test_auto_output_on_transformers_models_and_a_reference_lm(hf_tok):
    torch.manual_seed(0)
    bert_cls = track(transformers.BertForSequenceClassification(
        tiny_bert_config(num_labels=3)).eval())  # SDPA, the default
    torch.manual_seed(0)
    gpt2 = track(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(VOCAB), n_embd=16, n_layer=2, n_head=2, n_positions=32,
        initializer_range=0.3)).eval())
    torch.manual_seed(0)
    bert = track(transformers.BertModel(tiny_bert_config()).eval())
    ref_lm, ref_tok = build_reference("transformer")
    track(ref_lm)
    cases = [(bert_cls, hf_tok, {"tvd", "jsd", "flip", "top_prob"}),
             (gpt2, hf_tok, {"tvd", "jsd", "flip", "top_prob"}),
             (bert, hf_tok, {"cosine_distance", "l2_distance"}),
             (ref_lm, ref_tok, {"tvd", "jsd", "flip", "top_prob"})]
    for model, tok, metrics in cases:
        table = run(model, tok, HF_TEXTS, "uniform", scope="layer:1")
        check_table(table)
        assert set(table["metric"]) == metrics
        assert (table[table["metric"].isin(["tvd", "cosine_distance"])]["perturbed"] > 0).all()
    # gpt2's next token is read at the last real token: padding does not change it
    alone = run(gpt2, hf_tok, HF_TEXTS[1:], "uniform", scope="layer:1")
    together = run(gpt2, hf_tok, HF_TEXTS, "uniform", scope="layer:1")
    assert alone["perturbed"].tolist() == pytest.approx(
        together[together["example_id"] == "1"]["perturbed"].tolist(), abs=1e-5)
    with pytest.raises(InputError, match="output='classifier' needs logits"):
        run(bert, hf_tok, HF_TEXTS, "uniform", output="classifier")


def test_mean_ablation_uses_the_means_of_the_same_texts(hf_tok):
    torch.manual_seed(0)
    bert = track(transformers.BertModel(tiny_bert_config()).eval())
    table = run(bert, hf_tok, HF_TEXTS, "mean", scope="head:0.1")
    check_table(table, ("means_from", "n_texts"))
    assert set(table["perturbation"]) == {"mean"}
    assert params_at(table, 0) == {"means_from": "texts", "n_texts": 2}
    assert (table[table["metric"] == "cosine_distance"]["perturbed"] > 0).all()
    with pytest.raises(InputError, match="needs a scalar to differentiate"):
        run(bert, hf_tok, HF_TEXTS, "importance")


def test_ap_perturb_run_is_callable_after_the_submodule_is_imported(classifier):
    import attnprobe.perturb.experiments  # noqa: F401  binds the package attribute to the module

    model, tok = classifier
    assert ap.perturb.run is run
    table = ap.perturb.run(model, tok, TEXTS[:1], "uniform")
    assert tuple(table.columns) == RUN_COLUMNS
    assert ap.perturb.EXPERIMENTS is EXPERIMENTS
    assert set(EXPERIMENTS.names()) >= {"ablate", "adversarial", "dirichlet", "erase",
                                        "importance", "knockout", "mean", "permute", "uniform"}


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("args", "kw", "match"), [
    (("nope",), {}, r"unknown experiment 'nope'; choose one of 'ablate', 'adversarial'"),
    (("zero",), {}, r"'zero' is a perturbation; the experiment 'ablate' applies it"),
    (("uniform",), {"scope": "layer:7"}, r"layers \[7\] out of range"),
    (("uniform",), {"scope": "head:0.9"}, r"heads \[9\] out of range"),
    (("uniform",), {"scope": "lay:1"}, r"scope 'lay:1'"),
    (("adversarial",), {"eps": 0}, r"eps must be a finite number > 0"),
    (("adversarial",), {"eps": -0.5}, r"eps .* > 0; got -0.5"),
    (("permute",), {"n_permutations": 0}, r"n_permutations must be an integer >= 1"),
    (("permute",), {"n_permutations": 2.5}, r"n_permutations must be an integer >= 1"),
    (("permute",), {"n_permutations": True}, r"n_permutations must be an integer"),
    (("erase",), {"max_erased": 0}, r"max_erased must be an integer >= 1"),
    (("dirichlet",), {"alpha": 0.0}, r"alpha must be a finite number > 0"),
    (("dirichlet",), {"alpha": float("nan")}, r"alpha must be a finite number > 0"),
    (("adversarial",), {"lr": 0}, r"lr must be a finite number > 0"),
    (("importance",), {"prune_steps": 0}, r"prune_steps must be an integer >= 1"),
    (("uniform",), {"steps": 3}, r"experiment 'uniform' takes no options of its own .*; "
                                 r"got steps"),
    (("uniform",), {"eps": 0.5, "k": 7}, r"experiment 'uniform' takes no options of its own"
                                         r" .*; got eps, k$"),
    (("erase",), {"k": 2}, r"experiment 'erase' takes the options max_erased, rankings, "
                           r"n_steps .*; got k$"),
    (("dirichlet",), {"n_permutations": 8}, r"'dirichlet' takes the options n_draws, alpha"),
    (("permute",), {"batch_size": 0}, r"batch_size must be a positive integer"),
    (("permute",), {"seed": -1}, r"seed must be an integer >= 0"),
    (("uniform",), {"truncation": "drop"}, r"unknown truncation 'drop'"),
    (("uniform",), {"distributed": True}, r"distributed=True needs an initialised"),
    (("erase",), {"rankings": []}, r"rankings must be a non-empty list of names"),
    (("erase",), {"rankings": ["gradient"]}, r"unknown erase ranking 'gradient'"),
    (("uniform",), {"output": "logits"}, r"unknown output 'logits'"),
    (("mean",), {}, r"transformers"),
])
def test_bad_input_is_an_input_error(classifier, args, kw, match):
    model, tok = classifier
    with pytest.raises(InputError, match=match):
        run(model, tok, TEXTS[:1], *args, **kw)


def test_bad_texts_and_a_model_in_training_mode_are_input_errors(classifier):
    model, tok = classifier
    with pytest.raises(InputError, match="no text"):
        run(model, tok, [], "uniform")
    with pytest.raises(InputError, match="text 1 is empty"):
        run(model, tok, ["the cat", " "], "uniform")
    model.train()
    try:
        with pytest.raises(InputError, match=r"training mode .* model.eval\(\)"):
            run(model, tok, TEXTS[:1], "uniform")
    finally:
        model.eval()


class NoAttention(nn.Module):
    """A classifier without attention (no hook points, not a transformers model)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(500, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask=None):
        return self.out(self.embed(input_ids).mean(1))


@pytest.mark.parametrize("experiment", ["uniform", "permute", "erase"])
def test_a_model_that_bypasses_the_seam_fails_loudly(classifier, experiment):
    _, tok = classifier
    model = track(NoAttention().eval())
    with pytest.raises(AttentionUnavailableError,
                       match=rf"perturb {experiment} \(unperturbed forward.*cannot capture"):
        run(model, tok, TEXTS[:1], experiment)


# ----------------------------------------------------------------------------- batching, ids
def test_draws_run_at_most_batch_size_rows_per_forward(classifier):
    model, tok = classifier
    rows: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])), with_kwargs=True)
    try:
        default = run(model, tok, TEXTS[:1], "permute", n_permutations=40)
        rows_default, rows[:] = list(rows), []
        small = run(model, tok, TEXTS[:1], "permute", n_permutations=40, batch_size=40)
    finally:
        handle.remove()
    # the first forward reads the output kind, then the clean forward, then the draws
    assert rows_default == [1, 1, 16, 16, 8] and rows == [1, 1, 40]
    pd.testing.assert_frame_equal(default, small, **BATCHED)


def test_skipped_texts_keep_every_other_text_its_index_and_its_draws(hf_tok):
    torch.manual_seed(0)
    bert_cls = track(transformers.BertForSequenceClassification(
        tiny_bert_config(num_labels=2)).eval())
    long = " ".join(["cat"] * 80)  # more tokens than max_position_embeddings = 64
    texts = [HF_TEXTS[0], long, HF_TEXTS[1]]
    skipped = run(bert_cls, hf_tok, texts, "permute", n_permutations=4, truncation="skip")
    assert list(dict.fromkeys(skipped["example_id"])) == ["0", "2"]
    full = run(bert_cls, hf_tok, [HF_TEXTS[0], "a dog", HF_TEXTS[1]], "permute",
               n_permutations=4)
    pd.testing.assert_frame_equal(skipped.reset_index(drop=True),
                                  full[full["example_id"] != "1"].reset_index(drop=True))
    with pytest.raises(InputError, match=r"text 1 has \d+ tokens but the model takes at most 64"):
        run(bert_cls, hf_tok, texts, "permute", n_permutations=4)
    cut = run(bert_cls, hf_tok, texts, "uniform", truncation="cut")
    assert list(dict.fromkeys(cut["example_id"])) == ["0", "1", "2"]
    capped = run(bert_cls, hf_tok, texts, "uniform", truncation="skip", max_length=7)
    assert list(dict.fromkeys(capped["example_id"])) == ["2"]  # "a dog ran": 5 tokens


def test_importance_does_not_depend_on_the_batching(classifier):
    model, tok = classifier
    one = run(model, tok, TEXTS, "importance", batch_size=1)
    every = run(model, tok, TEXTS, "importance", batch_size=16)
    pd.testing.assert_frame_equal(one, every, **BATCHED)
