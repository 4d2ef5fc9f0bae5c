"""logit_attribution: a layer × head heatmap of each head's mean part of the metric and a bar
per component group; composition: a writer × reader heatmap per kind. Tables are built by
hand, so every drawn value is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.heads.direct_logits import COLUMNS
from attnprobe.heads.head_composition import COLUMNS as COMPOSITION_COLUMNS
from tests.unit.plot.drawn import mesh, render, ticks


def dla_table() -> pd.DataFrame:
    """Two examples; example e, position p: head (l, h) is worth 10l + h + e, the embeddings
    1, layer 0's MLP -2, the norm bias 0.5; example 1 has two positions (each half)."""
    rows = []
    for example, positions in ((0, (3,)), (1, (2, 4))):
        share = 1 / len(positions)
        for p in positions:
            rows.append((str(example), p, "embed", "embed", pd.NA, pd.NA, 1.0 * share))
            for layer in range(2):
                for head in range(3):
                    rows.append((str(example), p, f"L{layer}H{head}", "head", layer, head,
                                 (10 * layer + head + example) * share))
            rows.append((str(example), p, "L0.mlp", "mlp", 0, pd.NA, -2.0 * share))
            rows.append((str(example), p, "norm_bias", "bias", pd.NA, pd.NA, 0.5 * share))
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "metric"])
    frame.insert(6, "metric", "logit:next")
    return frame.astype({"layer": "Int64", "head": "Int64"})


def test_dla_figure_draws_each_heads_mean_and_the_groups():
    fig = ap.plot.logit_attribution(dla_table())
    heat, bars = fig.axes[0], fig.axes[1]  # the heatmap, the bars (then the colour bar)
    want = np.array([[10 * layer + head + 0.5 for head in range(3)] for layer in range(2)])
    assert np.allclose(mesh(heat), want)
    labels = ticks(bars, "y")
    assert labels == ["embed", "L0 heads", "L0 mlp", "L1 heads", "biases"]
    tops = [patch.get_y() for patch in bars.patches]
    assert tops == sorted(tops, reverse=True)  # the first group on top
    widths = dict(zip(labels, (patch.get_width() for patch in bars.patches), strict=True))
    assert widths["L0 heads"] == pytest.approx((3 + 6) / 2)  # examples 0 and 1, mean
    assert widths["L1 heads"] == pytest.approx((33 + 36) / 2)
    assert widths["L0 mlp"] == pytest.approx(-2.0)
    assert sum(widths.values()) == pytest.approx(1 + 4.5 - 2 + 34.5 + 0.5)
    render(fig)


def test_dla_figure_takes_the_result_object():
    model, tok = ap.load_model("ref:llama")
    result = ap.heads.logit_attribution(model, tok, ["the cat sat"], "logit:dog")
    heat = ap.plot.logit_attribution(result).axes[0]
    assert np.allclose(mesh(heat), result.by_head().to_numpy())


def composition_table() -> pd.DataFrame:
    rows = []
    for kind, base in (("q", 0.1), ("k", 0.2)):
        for wl, rl in ((0, 1), (0, 2), (1, 2)):
            for wh in range(2):
                for rh in range(2):
                    rows.append((kind, wl, wh, rl, rh, base * (1 + wl + rl + wh + rh), base))
    return pd.DataFrame(rows, columns=COMPOSITION_COLUMNS)


def test_composition_figure_draws_writers_by_readers_per_kind():
    table = composition_table()
    fig = ap.plot.composition(table, value="ratio")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["q-composition (baseline 0.100)",
                                                 "k-composition (baseline 0.200)"]
    values = mesh(panels[1])
    assert values.shape == (4, 4)  # writers L0H0..L1H1 × readers L1H0..L2H1
    assert ticks(panels[1], "y") == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert ticks(panels[1], "x") == ["L1H0", "L1H1", "L2H0", "L2H1"]
    assert values[0, 0] == pytest.approx(2.0) and values[3, 3] == pytest.approx(6.0)
    assert np.isnan(values[2, 0])  # layer 1 cannot write into layer 1
    only_k = ap.plot.composition(table, kinds=["k"])
    assert len([ax for ax in only_k.axes if ax.get_title()]) == 1
    render(fig)


def test_figures_refuse_bad_input_with_one_line():
    with pytest.raises(InputError, match="no composition kind"):
        ap.plot.composition(composition_table(), kinds=["v"])
    with pytest.raises(InputError, match="composition value"):
        ap.plot.composition(composition_table(), value="size")
    with pytest.raises(InputError, match="lacks column"):
        ap.plot.logit_attribution(pd.DataFrame({"layer": [0]}))
    with pytest.raises(InputError, match="LogitAttribution"):
        ap.plot.logit_attribution(42)
