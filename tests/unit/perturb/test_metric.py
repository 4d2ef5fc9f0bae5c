"""``run(..., metric=...)``: the one metric vocabulary in perturbation experiments. A scalar
metric read by the experiments equals the same metric computed by hand from the logits of the
plain and the perturbed forward; per-text positions follow the caller's indices; experiments
that measure something else refuse a metric in one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import attnprobe as ap
from attnprobe.core.metric import parse_metric
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.perturb import EdgeMasks, Scope, Zero, parse_edges, perturbed, reads_metric, run
from attnprobe.perturb.table import RUN_COLUMNS
from tests.conftest import track
from tests.integration.causal_lms import causal_lm

TEXTS = ["w5 w6 w7 w8 w9", "w10 w11 w12", "w13 w14 w15 w16"]
NUMBERS = ["baseline", "perturbed", "change"]


@pytest.fixture(scope="module")
def llama():
    return causal_lm("llama")


@pytest.fixture(scope="module")
def classifier():
    model, tok = build_reference("transformer-classifier")
    return track(model), tok


def logits_by_hand(model, tok, texts, *parts, intervention=None):
    """``[batch, seq, vocab]`` logits of a right-padded batch: plain, with capture parts, or
    inside ``perturbed``; and the batch."""
    inputs = dict(tok(texts, padding=True, return_tensors="pt"))
    with torch.no_grad():
        if parts:
            with ap.capture(model, parts=list(parts)):
                return model(**inputs).logits, inputs
        if intervention is not None:
            with perturbed(model, intervention, Scope()):
                return model(**inputs).logits, inputs
        return model(**inputs).logits, inputs


def mean_at(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Per example, the mean of ``values [batch, seq]`` over the ``where`` positions."""
    return (values * where).sum(-1) / where.sum(-1)


def by_hand(spec: str, logits: torch.Tensor, inputs: dict) -> torch.Tensor:
    """The metrics of this test, from the logits (independent of core/metric.py)."""
    ids, real = inputs["input_ids"], inputs["attention_mask"].bool()
    last = torch.zeros_like(real)
    last[torch.arange(len(real)), real.sum(-1) - 1] = True  # right padding
    nxt = real.clone()
    nxt[:, :-1] = real[:, :-1] & real[:, 1:]
    nxt[:, -1] = False
    w5, w6 = tok_id("w5"), tok_id("w6")
    if spec == "logit:w5 @ all":
        return mean_at(logits[..., w5], real)
    if spec == "logit_diff:w5,w6":
        return mean_at(logits[..., w5] - logits[..., w6], last)
    if spec == "loss":
        ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        return mean_at(F.pad(ce, (0, 1)), nxt)
    if spec == "prob:w6":
        return mean_at(logits.softmax(-1)[..., w6], last)
    raise AssertionError(spec)


def tok_id(word: str) -> int:
    return int(word[1:])  # the test tokenizer: w4 .. w99 are ids 4 .. 99


CASES = [("logit:w5", "all", "logit:w5 @ all"), ("logit_diff:w5,w6", None, "logit_diff:w5,w6"),
         ("loss", None, "loss"), ("prob:w6", "last", "prob:w6")]


@pytest.mark.parametrize(("metric", "positions", "name"), CASES)
def test_a_knockout_metric_equals_the_metric_computed_by_hand(llama, metric, positions, name):
    model, tok = llama
    table = ap.perturb.knockout(model, tok, TEXTS, "to:0", metric=metric, positions=positions)
    assert tuple(table.columns) == (*RUN_COLUMNS, "edges", "positions")
    assert set(table["metric"]) == {metric}
    assert set(table["positions"]) == {positions or ("all" if metric == "loss" else "last")}
    plain, inputs = logits_by_hand(model, tok, TEXTS)
    masks = EdgeMasks(parse_edges("to:0"), inputs, causal=True)
    knocked, _ = logits_by_hand(model, tok, TEXTS, masks.part)
    torch.testing.assert_close(torch.tensor(table["baseline"].values),
                               by_hand(name, plain, inputs).double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(table["perturbed"].values),
                               by_hand(name, knocked, inputs).double(), atol=1e-5, rtol=1e-5)
    assert ((table["perturbed"] - table["baseline"]) == table["change"]).all()


def test_an_ablation_sweep_and_a_callable_metric_equal_the_metric_by_hand(llama):
    model, tok = llama
    table = run(model, tok, TEXTS, "ablate", metric="logit_diff:w5,w6")
    plain, inputs = logits_by_hand(model, tok, TEXTS)
    ablated, _ = logits_by_hand(model, tok, TEXTS, intervention=Zero())
    torch.testing.assert_close(torch.tensor(table["perturbed"].values),
                               by_hand("logit_diff:w5,w6", ablated, inputs).double(),
                               atol=1e-5, rtol=1e-5)

    def first_w7(output, batch):
        return output.logits[:, 0, 7]

    custom = run(model, tok, TEXTS, "uniform", scope="layer:0", metric=first_w7)
    assert tuple(custom.columns) == RUN_COLUMNS and set(custom["metric"]) == {"custom"}
    torch.testing.assert_close(torch.tensor(custom["baseline"].values),
                               plain[:, 0, 7].double(), atol=1e-5, rtol=1e-5)
    # the sweep's rows are the single-head runs, metric included
    swept = run(model, tok, TEXTS, "ablate", metric="loss", sweep="head", scope="layer:1")
    one = run(model, tok, TEXTS, "ablate", metric="loss", scope="head:1.3")
    pd.testing.assert_frame_equal(swept[swept["head"] == 3][NUMBERS].reset_index(drop=True),
                                  one[NUMBERS], rtol=1e-5, atol=1e-5)


def test_per_text_positions_follow_the_callers_indices(llama):
    model, tok = llama
    lists = [[1, 3], [0], [-1]]
    together = run(model, tok, TEXTS, "ablate", scope="layer:0", metric="logit:w9",
                   positions=lists, batch_size=2)
    assert set(together["positions"]) == {"per text"}
    for i, text in enumerate(TEXTS):
        alone = run(model, tok, [text], "ablate", scope="layer:0", metric="logit:w9",
                    positions=lists[i])
        assert together.iloc[i][NUMBERS].tolist() == pytest.approx(
            alone.iloc[0][NUMBERS].tolist(), abs=1e-5)
    shared = run(model, tok, TEXTS, "ablate", scope="layer:0", metric="logit:w9",
                 positions=[0, -1])
    assert set(shared["positions"]) == {"0,-1"}


def test_draws_summarise_a_scalar_metric_over_the_draws(llama):
    model, tok = llama
    table = run(model, tok, TEXTS[:2], "permute", metric="loss", n_permutations=6)
    scalar = table[table["metric"] == "loss"]
    assert scalar["summary"].tolist() == ["median", "mean", "min", "max"] * 2
    plain, inputs = logits_by_hand(model, tok, TEXTS[:2])
    torch.testing.assert_close(torch.tensor(scalar["baseline"].values[::4]),
                               by_hand("loss", plain, inputs).double(), atol=1e-5, rtol=1e-5)
    for _, group in scalar.groupby("example_id"):
        value = group.set_index("summary")["perturbed"]
        assert value["min"] <= value["median"] <= value["max"]
        assert value["min"] <= value["mean"] <= value["max"]
    assert set(table["metric"]) == {"loss", "max_attention"}


def test_the_default_metric_is_the_distributional_change(llama):
    model, tok = llama
    default = run(model, tok, TEXTS, "uniform", scope="layer:1")
    pd.testing.assert_frame_equal(run(model, tok, TEXTS, "uniform", scope="layer:1",
                                      metric="next-token"), default)
    assert set(default["metric"]) == {"tvd", "jsd", "flip", "top_prob"}
    assert tuple(default.columns) == RUN_COLUMNS


def test_which_experiments_take_a_metric():
    readers = {name for name in ap.perturb.EXPERIMENTS.names() if reads_metric(name)}
    assert readers >= {"ablate", "dirichlet", "knockout", "mean", "permute", "uniform"}
    assert not readers & {"erase", "adversarial", "importance"}


@pytest.mark.parametrize(("experiment", "kw", "match"), [
    ("erase", {"metric": "loss"}, r"perturb erase does not take metric 'loss': it erases keys "
                                  r"until .* \(a metric is read by ablate, dirichlet, knockout"),
    ("adversarial", {"metric": "loss"}, r"perturb adversarial does not take metric"),
    ("importance", {"metric": "loss"}, r"perturb importance does not take metric 'loss': it "
                                       r"differentiates its target"),
    ("uniform", {"positions": "all"}, r"positions changes nothing with the default metric"),
    ("uniform", {"metric": "loss", "output": "lm"}, r"output='lm' chooses what the default "
                                                    r"metric"),
    ("uniform", {"metric": "logit:w5", "positions": "first"}, r"unknown positions 'first'"),
    ("uniform", {"metric": "logit:w5", "positions": [[0], [1]]},
     r"positions gives 2 lists for 1 texts"),
    ("uniform", {"metric": "logit:w5", "positions": torch.ones(1, 6, dtype=torch.bool)},
     r"a positions mask belongs to one padded batch"),
    ("uniform", {"metric": "logit:w5", "positions": [9]}, r"position 9 is out of range"),
    ("uniform", {"metric": "logit:next"}, r"the last position has no next token"),
    ("uniform", {"metric": "logit:zzz"}, r"'zzz' is not in the tokenizer's vocabulary"),
    ("uniform", {"metric": "logits:w5"}, r"unknown metric kind 'logits'"),
    ("uniform", {"metric": parse_metric("next-token")}, r"metric 'next-token' still has to be "
                                                        r"fixed"),
    ("uniform", {"metric": lambda o, b: o.logits[:, 0, 5], "positions": "all"},
     r"positions changes nothing for a Metric object or a callable"),
    ("uniform", {"metric": 3}, r"metric must be a spec"),
])
def test_bad_metrics_are_one_line_input_errors(llama, experiment, kw, match):
    model, tok = llama
    with pytest.raises(InputError, match=match):
        run(model, tok, TEXTS[:1], experiment, **kw)


def test_a_logit_metric_on_a_classifier_says_it_needs_lm_logits(classifier):
    model, tok = classifier
    with pytest.raises(InputError, match=r"metric logit:cat needs language-model logits"):
        run(model, tok, ["the cat sat"], "uniform", metric="logit:cat")
    table = run(model, tok, ["the cat sat"], "uniform", metric=lambda out, batch: out[:, 1])
    assert set(table["metric"]) == {"custom"}
