"""agreement_by_layer draws the mean ± std per layer and view; token_heat the scores per token."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.plot import agreement_by_layer, token_heat
from attnprobe.types import TokenAttribution
from tests.helpers import tiny_bert_classifier
from tests.unit.plot.drawn import mesh, render, ticks

VIEWS = ("raw", "rollout")
METHODS = ("saliency", "integrated_gradients")


def agreement_table() -> pd.DataFrame:
    rows = []
    for example in range(3):
        for method in METHODS:
            for v, view in enumerate(VIEWS):
                for layer in range(3):
                    for metric in ("kendall_tau", "jsd"):
                        value = 0.1 * layer + 0.3 * v + 0.05 * example + (method == "saliency")
                        rows.append((str(example), f"{view}@L{layer}", "attention", view,
                                     layer, method, metric, value, 0.5))
            if method == "integrated_gradients":
                rows.append((str(example), "saliency", "attribution", "saliency", None, method,
                             "kendall_tau", 0.2 * example, 0.5))
    columns = ["example_id", "source", "source_kind", "view", "layer", "method", "metric",
               "value", "p_value"]
    table = pd.DataFrame(rows, columns=columns)
    table["layer"] = table["layer"].astype("Int64")
    return table


def lines(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {line.get_label(): (np.asarray(line.get_xdata(), float),
                               np.asarray(line.get_ydata(), float))
            for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_one_line_per_view_with_the_mean_per_layer_and_a_panel_per_method():
    fig = agreement_by_layer(agreement_table())
    render(fig)
    assert [ax.get_title() for ax in fig.axes] == [f"attention vs {m}" for m in METHODS]
    drawn = lines(fig.axes[0])  # saliency: 1 + 0.1 layer + 0.3 view + mean(0, .05, .1)
    for v, view in enumerate(VIEWS):
        x, y = drawn[view]
        np.testing.assert_array_equal(x, [0, 1, 2])
        np.testing.assert_allclose(y, 1.05 + 0.1 * x + 0.3 * v)
    bands = [c for c in fig.axes[0].collections]
    assert len(bands) == 2  # ± std, one per view
    reference = lines(fig.axes[1])["saliency (attribution)"]  # ig vs saliency: no layer
    np.testing.assert_allclose(reference[1], [0.2, 0.2])
    assert "Kendall" in fig.axes[0].get_ylabel()


def test_summary_and_comparison_like_objects_draw_the_same():
    table = agreement_table()
    from_table = lines(agreement_by_layer(table, method="saliency").axes[0])

    class Found:  # what a Comparison offers
        def summary(self):
            keys = ["source_kind", "view", "layer", "source", "method", "metric"]
            return table.groupby(keys, dropna=False)["value"].agg(["mean", "std"]).reset_index()

    from_summary = lines(agreement_by_layer(Found(), method="saliency").axes[0])
    for view in VIEWS:
        np.testing.assert_allclose(from_summary[view][1], from_table[view][1])


def test_metric_views_and_axes():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    out = agreement_by_layer(agreement_table(), metric="jsd", method="saliency",
                             views=["rollout"], ax=ax)
    assert out is ax and list(lines(ax)) == ["rollout"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"metric": "auroc"}, "no metric 'auroc'"),
    ({"method": "occlusion"}, "no method 'occlusion'"),
    ({"views": ["flow"]}, r"no view \['flow'\]"),
    ({"ax": "not an axes"}, "pass method="),
    ({"ax": "not an axes", "method": "saliency"}, "ax must be a matplotlib Axes"),
])
def test_agreement_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        agreement_by_layer(agreement_table(), **kwargs)


TOKENS = ("[CLS]", "the", "$cat$", "sat", "[SEP]")


def attributions() -> list[TokenAttribution]:
    return [TokenAttribution(torch.tensor([0.0, 2.0, -4.0, 1.0, 0.0]), TOKENS, "saliency",
                             "class:1", "0"),
            TokenAttribution(torch.tensor([0.5, 0.1, 0.2, 0.1, 0.1]), TOKENS, "raw@L1", "",
                             "0"),
            TokenAttribution(torch.tensor([1.0, 1.0]), ("[CLS]", "[SEP]"), "saliency",
                             "class:1", "1")]


def test_token_heat_rows_are_methods_and_cells_the_normalised_scores():
    fig = token_heat(attributions(), example_id="0", annotate=True)
    ax = fig.axes[0]
    render(fig)
    np.testing.assert_allclose(mesh(ax), [[0.0, 0.5, -1.0, 0.25, 0.0], [1.0, 0.2, 0.4, 0.2, 0.2]])
    assert ticks(ax, "x") == list(TOKENS)
    assert ticks(ax, "y") == ["saliency", "raw@L1"]
    assert len(ax.texts) == 10
    raw = mesh(token_heat(attributions()[:2], normalise=False, methods=["raw@L1"]).axes[0])
    np.testing.assert_allclose(raw, [[0.5, 0.1, 0.2, 0.1, 0.1]])
    table = pd.concat([a.to_frame() for a in attributions()])
    np.testing.assert_allclose(mesh(token_heat(table, example_id="0").axes[0]),
                               mesh(ax))


@pytest.mark.parametrize(("source", "kwargs", "message"), [
    (attributions(), {}, "pass example_id="),
    (attributions(), {"example_id": "7"}, "no example_id '7'"),
    (attributions()[:2], {"methods": ["occlusion"]}, "no method"),
    (attributions()[:2], {"methods": []}, "empty"),
    ("scores", {}, "expected a Comparison"),
    ([], {}, "no attributions"),
])
def test_token_heat_errors(source, kwargs, message):
    with pytest.raises(InputError, match=message):
        token_heat(source, **kwargs)


def test_a_real_comparison():
    model, tok = tiny_bert_classifier()
    found = ap.attribution.compare(model, tok, ["the cat sat on a mat", "a big dog ran"],
                                   "class:1", methods=["saliency", "leave_one_out"],
                                   views=["raw"])
    summary = found.summary()
    fig = agreement_by_layer(found, method="saliency")
    render(fig, "svg")
    _, y = lines(fig.axes[0])["raw"]
    expected = summary[(summary["view"] == "raw") & (summary["method"] == "saliency")
                       & (summary["metric"] == "kendall_tau")].sort_values("layer")
    np.testing.assert_allclose(y, expected["mean"])
    ax = token_heat(found, example_id="1").axes[0]
    assert ticks(ax, "x") == ["[CLS]", "a", "big", "dog", "ran", "[SEP]"]
    assert ticks(ax, "y") == ["saliency", "leave_one_out", "raw@L0", "raw@L1"]
