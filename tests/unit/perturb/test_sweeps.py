"""``run(..., sweep="head")``: every head of the scope perturbed alone in batched forwards. Each
sweep row equals the row of a single-head run (``scope="head:L.H"``) — on a tiny BERT, on
reference models, and for mean-ablation on a transformers model — and the forwards stay
within ``batch_size`` rows."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers

from attnprobe.capture.info import attention_sizes
from attnprobe.errors import EditNotAppliedError, InputError
from attnprobe.models import build_reference
from attnprobe.perturb import budget, run
from attnprobe.perturb.budget import forward_bytes
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab

TEXTS = ["the cat sat on the red mat", "a dog ran to the big tree", "the bird saw a fish"]
WORDS = "the cat sat on mat a dog ran big red tree bird saw fish to"
NUMBERS = ["baseline", "perturbed", "change"]


@pytest.fixture(scope="module")
def classifier():
    model, tok = build_reference("transformer-classifier")  # 2 layers x 2 heads
    return track(model), tok


@pytest.fixture(scope="module")
def bert():
    """A random BERT classifier, 3 layers x 4 heads (12 heads), SDPA as loaded."""
    vocab = bert_vocab(WORDS)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=32, max_position_embeddings=64, initializer_range=0.3, num_labels=3)
    model = transformers.BertForSequenceClassification(config).eval()
    return track(model), bert_tokenizer(vocab)


@pytest.fixture(scope="module")
def bert_encoder():
    """A random ``BertModel`` (embedding output), 2 layers x 2 heads, for mean-ablation."""
    vocab = bert_vocab(WORDS)
    torch.manual_seed(1)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, initializer_range=0.3)
    return track(transformers.BertModel(config).eval()), bert_tokenizer(vocab)


def one_run_per_head(model, tok, texts, experiment, heads, **kw) -> pd.DataFrame:
    return pd.concat([run(model, tok, texts, experiment, scope=f"head:{layer}.{head}", **kw)
                      for layer, head in heads], ignore_index=True)


def assert_same_table(swept: pd.DataFrame, expected: pd.DataFrame, atol: float = 1e-6) -> None:
    """Equal labels, columns and order; numbers equal up to float rounding."""
    pd.testing.assert_frame_equal(swept.drop(columns=NUMBERS), expected.drop(columns=NUMBERS))
    pd.testing.assert_frame_equal(swept[NUMBERS], expected[NUMBERS], check_exact=False,
                                  rtol=0, atol=atol)


def every_head(n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]


# ----------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize(("experiment", "batch_size"), [("ablate", 8), ("uniform", 16)])
def test_each_sweep_row_equals_its_single_head_run_on_a_tiny_bert(bert, experiment,
                                                                  batch_size):
    model, tok = bert  # forwards of 3 texts x 2 heads, and of 3 texts x 5 heads (two layers)
    swept = run(model, tok, TEXTS, experiment, sweep="head", batch_size=batch_size)
    assert len(swept) == 12 * len(TEXTS) * 4  # heads x texts x (tvd, jsd, flip, top_prob)
    assert_same_table(swept, one_run_per_head(model, tok, TEXTS, experiment, every_head(3, 4)))
    assert (swept[swept["metric"] == "tvd"]["perturbed"] > 0).all()


@pytest.mark.parametrize("name", ["transformer-classifier", "transformer"])
def test_each_sweep_row_equals_its_single_head_run_on_reference_models(name):
    model, tok = build_reference(name)  # a classifier, and a causal LM (next-token output)
    track(model)
    swept = run(model, tok, TEXTS, "ablate", sweep="head")
    heads = every_head(*attention_sizes(model))
    assert len(swept) == len(heads) * len(TEXTS) * 4
    assert_same_table(swept, one_run_per_head(model, tok, TEXTS, "ablate", heads))


def test_the_mean_sweep_equals_single_head_mean_ablations(bert_encoder):
    model, tok = bert_encoder
    swept = run(model, tok, TEXTS, "mean", sweep="head", batch_size=4)
    expected = one_run_per_head(model, tok, TEXTS, "mean", every_head(2, 2), batch_size=4)
    assert_same_table(swept, expected)
    assert swept["n_texts"].tolist() == [3] * len(swept)  # the means come from the 3 texts
    assert set(swept["metric"]) == {"cosine_distance", "l2_distance"}


def test_a_layer_sweep_equals_one_run_per_layer(bert):
    model, tok = bert
    swept = run(model, tok, TEXTS[:2], "uniform", sweep="layer", scope="layers:1-2")
    expected = pd.concat([run(model, tok, TEXTS[:2], "uniform", scope=f"layer:{layer}")
                          for layer in (1, 2)], ignore_index=True)
    assert_same_table(swept, expected)
    assert swept["layer"].tolist() == [1] * 8 + [2] * 8 and swept["head"].isna().all()
    assert set(swept["scope"]) == {"layer:1", "layer:2"}


# ----------------------------------------------------------------------------- table
def test_one_row_per_head_text_and_metric_with_integer_layer_and_head(bert):
    model, tok = bert
    swept = run(model, tok, TEXTS[:2], "ablate", sweep="head", scope="heads:0.3,2.1")
    assert swept["layer"].dtype == "Int64" and swept["head"].dtype == "Int64"
    units = swept[["layer", "head", "scope"]].drop_duplicates().values.tolist()
    assert units == [[0, 3, "head:0.3"], [2, 1, "head:2.1"]]
    assert swept.groupby(["layer", "head", "example_id"]).size().eq(4).all()  # no placeholders
    assert swept[NUMBERS].notna().all().all()
    grid = swept[swept["metric"] == "tvd"].pivot_table("change", "layer", "head")
    assert grid.shape == (2, 2)  # the heatmap the issue wanted, without parsing scopes


def test_the_same_call_gives_the_same_table_and_batching_changes_only_rounding(classifier):
    model, tok = classifier
    first = run(model, tok, TEXTS, "uniform", sweep="head", seed=3)
    pd.testing.assert_frame_equal(run(model, tok, TEXTS, "uniform", sweep="head", seed=3),
                                  first, check_exact=True)
    for size in (1, 2, 7, 64):
        assert_same_table(run(model, tok, TEXTS, "uniform", sweep="head", batch_size=size),
                          first)


def test_forwards_repeat_the_text_batch_once_per_head_within_batch_size(bert):
    model, tok = bert
    rows: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])), with_kwargs=True)
    try:
        run(model, tok, TEXTS, "ablate", sweep="head", batch_size=8)
        eight, rows[:] = list(rows), []
        run(model, tok, TEXTS[:1], "ablate", sweep="head", batch_size=16)
    finally:
        handle.remove()
    # the output-kind forward (1 text), the clean forward of the 3 texts, then 12 heads x 3
    # texts in forwards of 2 heads x 3 texts
    assert eight == [1, 3] + [6] * 6
    # one text: the clean forward, then 16 heads fit a forward: 12 rows, one per head
    assert rows == [1, 1, 12]


def test_the_budget_counts_texts_times_heads_per_forward(classifier, monkeypatch):
    model, tok = classifier
    seq = len(tok(TEXTS[:1])["input_ids"][0])  # the longest of these two texts
    assert seq >= len(tok(TEXTS[1:2])["input_ids"][0])
    one = forward_bytes(model, 1, seq)
    # room for 7 rows: 2 texts x 4 heads = 8 rows is refused, naming what fits
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": int(7.5 * one / 0.8))
    with pytest.raises(InputError, match=r"a forward of 8 rows .* set batch_size "
                                         r"\(--batch-size\) to 7 or less$"):
        run(model, tok, TEXTS[:2], "ablate", sweep="head")
    table = run(model, tok, TEXTS[:2], "ablate", sweep="head", batch_size=7)  # 2 x 3 rows
    assert len(table) == 4 * 2 * 4


# ----------------------------------------------------------------------------- errors
def test_a_head_whose_edit_changes_nothing_is_named():
    model, tok = build_reference("transformer-classifier")
    track(model)
    with torch.no_grad():  # every layer-0 row exactly uniform
        model.blocks[0].attn.q_proj.weight.zero_()
        model.blocks[0].attn.q_proj.bias.zero_()
    with pytest.raises(EditNotAppliedError, match=r"perturb uniform \(texts 0, 1.*uniform "
                                                  r"changed no attention weight of head:0.0 "
                                                  r"on texts 0, 1"):
        run(model, tok, TEXTS[:2], "uniform", sweep="head", batch_size=2)  # one head alone
    with pytest.raises(EditNotAppliedError, match=r"of head:0.0, head:0.1 on texts 0, 1"):
        run(model, tok, TEXTS[:2], "uniform", sweep="head")  # with layer 1 in the forward
    table = run(model, tok, TEXTS[:2], "uniform", sweep="head", scope="layer:1")
    assert set(table["layer"]) == {1}


@pytest.mark.parametrize(("experiment", "kw", "match"), [
    ("permute", {"sweep": "head", "n_permutations": 3},
     r"sweep='head' runs ablate, knockout, mean, uniform one head at a time; 'permute' does "
     r"not sweep"),
    ("importance", {"sweep": "layer"}, r"'importance' does not sweep"),
    ("ablate", {"sweep": "heads"}, r"unknown sweep 'heads'; choose one of 'head', 'layer'"),
    ("mean", {"sweep": "head"}, r"transformers"),
])
def test_bad_sweeps_are_input_errors(classifier, experiment, kw, match):
    model, tok = classifier
    with pytest.raises(InputError, match=match):
        run(model, tok, TEXTS[:1], experiment, **kw)
