"""head_effects: a layer × head heatmap of the mean change per head; pruning_curve: one point
per step plus the unpruned model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.plot import head_effects, pruning_curve
from tests.helpers import tiny_bert_classifier
from tests.unit.plot.drawn import mesh, render, ticks


def effect(layer: int, head: int, example: int) -> float:
    return 0.1 * layer + 0.01 * head + 0.002 * example


def scoped_table() -> pd.DataFrame:
    """The table of per-head runs concatenated: the head only in ``scope``."""
    rows = []
    for layer in range(3):
        for head in range(4):
            for example in range(2):
                change = effect(layer, head, example)
                rows.append(("ablate", "zero", "{}", f"head:{layer}.{head}", str(example),
                             pd.NA, "tvd", 0.0, change, change))
                rows.append(("ablate", "zero", "{}", f"head:{layer}.{head}", str(example),
                             pd.NA, "top_prob", 0.7, 0.7 - change, -change))
    rows.append(("ablate", "zero", "{}", "layer:1", "0", pd.NA, "tvd", 0.0, 9.0, 9.0))
    rows.append(("ablate", "zero", "{}", "heads:0.1,2.3", "0", pd.NA, "tvd", 0.0, 9.0, 9.0))
    return pd.DataFrame(rows, columns=["experiment", "perturbation", "params", "scope",
                                       "example_id", "step", "metric", "baseline",
                                       "perturbed", "change"])


def column_table() -> pd.DataFrame:
    """A sweep's table: integer ``layer`` / ``head`` columns (NA where not one head)."""
    table = scoped_table().drop(columns="params")
    pairs = [ap.Scope.parse(s) for s in table["scope"]]
    table.insert(3, "layer", pd.array([next(iter(p.terms))[0] if len(p.terms) == 1 else pd.NA
                                       for p in pairs], dtype="Int64"))
    table.insert(4, "head", pd.array([next(iter(p.terms))[1] if len(p.terms) == 1 else pd.NA
                                      for p in pairs], dtype="Int64"))
    table["scope"] = "ignored when the columns are there"
    return table


EXPECTED = np.array([[effect(layer, head, 0) + 0.001 for head in range(4)]
                     for layer in range(3)])


@pytest.mark.parametrize("make", [scoped_table, column_table])
def test_head_effects_is_the_mean_change_per_head(make):
    fig = head_effects(make())
    ax = fig.axes[0]
    render(fig)
    np.testing.assert_allclose(mesh(ax), EXPECTED)  # tvd: the preferred metric
    assert ticks(ax, "x") == ["0", "1", "2", "3"] and ticks(ax, "y") == ["0", "1", "2"]
    assert ax.get_title() == "ablate: tvd per head, 2 example(s)"
    assert len(ax.texts) == 12  # annotated


def test_a_negative_metric_and_missing_heads():
    table = scoped_table()
    table = table[table["scope"] != "head:2.3"]
    ax = head_effects(table, metric="top_prob", annotate=False).axes[0]
    cells = mesh(ax)
    assert np.isnan(cells[2, 3])
    expected = -EXPECTED.copy()
    expected[2, 3] = np.nan
    np.testing.assert_allclose(cells, expected)
    assert not ax.texts


def test_importance_rows_of_a_real_run():
    model, tok = tiny_bert_classifier()
    texts = ["the cat sat on a mat", "a big dog ran"]
    table = ap.perturb.run(model, tok, texts, "importance")
    per_head = one_of(table, "importance")
    fig = head_effects(table, metric="importance")
    render(fig, "svg")
    np.testing.assert_allclose(mesh(fig.axes[0]), per_head, rtol=1e-6)
    curve = table[table["step"].notna()]
    ax = pruning_curve(table).axes[0]
    drawn = {line.get_label(): line for line in ax.get_lines()}
    assert set(drawn) == set(curve["metric"])
    for name, line in drawn.items():
        rows = curve[curve["metric"] == name].sort_values("step")
        assert list(line.get_xdata()) == [0, *rows["step"].astype(int)]
        np.testing.assert_allclose(line.get_ydata(), [rows["baseline"].iloc[0],
                                                      *rows["perturbed"]])
    ablated = pd.concat([ap.perturb.run(model, tok, texts, "ablate", scope=f"head:{layer}.{h}")
                         for layer in range(2) for h in range(2)])
    cells = mesh(head_effects(ablated).axes[0])
    tvd = ablated[ablated["metric"] == "tvd"]
    assert cells[1, 0] == pytest.approx(tvd[tvd["scope"] == "head:1.0"]["change"].mean())


def one_of(table: pd.DataFrame, metric: str) -> np.ndarray:
    rows = table[(table["metric"] == metric) & table["step"].isna()]
    grid = np.full((2, 2), np.nan)
    for scope, value in zip(rows["scope"], rows["change"], strict=True):
        layer, head = next(iter(ap.Scope.parse(scope).terms))
        grid[layer, head] = value
    return grid


def test_pruning_curve_of_the_curve_function_output():
    curve = pd.DataFrame({"n_pruned": [0, 2, 4], "share_pruned": [0, 0.5, 1.0],
                          "metric": [0.9, 0.8, 0.3]})
    ax = pruning_curve(curve).axes[0]
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0, 2, 4]
    np.testing.assert_allclose(line.get_ydata(), [0.9, 0.8, 0.3])


@pytest.mark.parametrize(("call", "message"), [
    (lambda: head_effects(scoped_table().iloc[:0]), "empty"),
    (lambda: head_effects(scoped_table().drop(columns="scope")), "layer/head columns or a scope"),
    (lambda: head_effects(scoped_table()[lambda t: t["scope"] == "layer:1"]),
     "no row covers exactly one head"),
    (lambda: head_effects(scoped_table(), metric="jsd"), "no per-head metric 'jsd'"),
    (lambda: head_effects(pd.concat([scoped_table(), scoped_table().assign(
        experiment="uniform")])), "pass experiment="),
    (lambda: head_effects(scoped_table().assign(step=1)), "pass step="),
    (lambda: pruning_curve(scoped_table()), "no experiment 'importance'"),
    (lambda: pruning_curve(scoped_table().assign(experiment="importance")), "no pruning steps"),
    (lambda: pruning_curve(scoped_table().assign(step=1, experiment="importance"),
                           metric="agreement"), "no pruning metric"),
    (lambda: pruning_curve("table"), "expected a perturbation table"),
])
def test_bad_input_is_a_one_line_error(call, message):
    with pytest.raises(InputError, match=message):
        call()
