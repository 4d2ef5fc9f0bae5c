"""``ap.plot.faithfulness``: the mean deletion curves with their bands and the ranking as dots
with CI whiskers, drawn from a hand-built :class:`Faithfulness` whose means are written out
(:mod:`tests.unit.faithfulness.synthetic`)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import LineCollection

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.plot.erasure import BASELINE_COLOUR, faithfulness_rows
from tests.unit.faithfulness import synthetic
from tests.unit.plot.drawn import points, render, rgb, ticks

EPS = 1e-12  # the means of three decimals: float64 sums, exact to a few ulps


def _top_down(axes) -> list[str]:
    """The y tick labels from the top of the panel down."""
    pairs = zip(axes.get_yticks(), ticks(axes, "y"), strict=True)
    return [label for _, label in sorted(pairs, key=lambda p: -p[0])]


def _lines(axes):
    return {line.get_label(): line for line in axes.get_lines()
            if not line.get_label().startswith("_")}


def test_the_curves_are_the_hand_mean_drops_with_their_styles_and_bands():
    found = synthetic.result()
    fig = ap.plot.faithfulness(found)
    curves, ranking = fig.axes
    assert render(fig)[:4] == b"\x89PNG" and render(fig, "svg").startswith(b"<?xml")
    lines = _lines(curves)
    # deletion only by default: insertion is optional
    assert {label for label in lines if "baseline" not in label} == {
        f"{s} {c}" for s in synthetic.KINDS for c in ("deletion_morf", "deletion_lerf")}
    for source in synthetic.KINDS:
        for curve, style in (("deletion_morf", "-"), ("deletion_lerf", "--")):
            line = lines[f"{source} {curve}"]
            np.testing.assert_allclose(line.get_xdata(), synthetic.FRACTIONS)
            np.testing.assert_allclose(line.get_ydata(), synthetic.mean_drop(source, curve),
                                       atol=EPS)
            assert line.get_linestyle() == style
    assert lines["random deletion_morf"].get_color() == BASELINE_COLOUR
    # the band of each curve (drawn right after it) runs from its bootstrap low to high
    bands = curves.collections
    assert len(bands) == len(lines)
    table = found.curves().set_index(["source", "curve", "fraction"])
    for (label, _), band in zip(lines.items(), bands, strict=True):
        source, curve = label.split()
        edges = {round(float(y), 9) for y in band.get_paths()[0].vertices[:, 1]}
        part = table.loc[(source, curve)]
        assert {round(float(v), 9) for v in (*part.low, *part.high)} <= edges
        assert (part.low <= part.value + EPS).all() and (part.value <= part.high + EPS).all()
    assert fig.axes[1] is ranking


def test_insertion_curves_are_dotted_when_asked_for():
    fig = ap.plot.faithfulness(synthetic.result(), insertion=True, panel="curves")
    line = _lines(fig.axes[0])["saliency insertion_morf"]
    assert line.get_linestyle() == ":"
    np.testing.assert_allclose(line.get_ydata(), synthetic.mean_drop("saliency", "insertion_morf"),
                               atol=EPS)


@pytest.mark.parametrize(("metric", "order"), [
    ("aopc_comprehensiveness", ["saliency", "raw@L1"]),
    ("aopc_sufficiency", ["saliency", "raw@L1"]),  # lower is better: saliency 0.1 < 0.4
    ("tau_loo", ["saliency", "raw@L1"]),
])
def test_the_dots_are_the_hand_means_best_first_with_the_summary_ci(metric, order):
    found = synthetic.result()
    fig = ap.plot.faithfulness(found, metric=metric, panel="ranking")
    axes = fig.axes[0]
    xy, colours = points(axes)
    # the best at the top: y decreasing in rank order
    assert _top_down(axes) == order
    by_y = {round(y): x for x, y in xy}
    rows = dict(zip(ticks(axes, "y"), axes.get_yticks(), strict=True))
    for source in order:
        assert by_y[int(rows[source])] == pytest.approx(synthetic.mean_of(source, metric),
                                                        abs=EPS)
    summary = found.summary().set_index("source")
    whiskers = [c for c in axes.collections if isinstance(c, LineCollection)]
    segments = {round(seg[0][1]): (seg[0][0], seg[1][0])
                for c in whiskers for seg in c.get_segments()}
    for source in order:
        low, high = segments[int(rows[source])]
        assert (low, high) == pytest.approx((summary.loc[source, f"{metric}_low"],
                                             summary.loc[source, f"{metric}_high"]), abs=EPS)
        assert low <= synthetic.mean_of(source, metric) <= high
    # the random baseline is a dashed vertical reference line, not a dot
    baseline = _lines(axes)["random baseline"]
    assert baseline.get_linestyle() == "--"
    assert baseline.get_xdata()[0] == pytest.approx(synthetic.mean_of("random", metric),
                                                    abs=EPS)
    assert "random" not in ticks(axes, "y")
    assert rgb(BASELINE_COLOUR) not in {tuple(c) for c in np.round(colours, 6)}


def test_sources_filter_and_the_table_is_the_figure_data():
    found = synthetic.result()
    rows = faithfulness_rows(found, sources=["raw@L1"])
    assert set(rows["source"]) == {"raw@L1", "random"}  # the baseline is always kept
    fig = ap.plot.faithfulness(rows)  # the table itself draws the same figure
    assert {label.split()[0] for label in _lines(fig.axes[0])} == {"raw@L1", "random"}


@pytest.mark.parametrize(("call", "message"), [
    (lambda r: ap.plot.faithfulness(r, metric="nope"), "unknown metric 'nope'"),
    (lambda r: ap.plot.faithfulness(r, sources=["ig"]), r"no source \['ig'\]"),
    (lambda r: ap.plot.faithfulness(r, panel="bars"), "unknown panel 'bars'"),
    (lambda r: ap.plot.faithfulness(r, ax=object()), "ax holds one panel"),
    (lambda r: ap.plot.faithfulness(r, panel="curves", ax=object()), "ax must be"),
    (lambda r: ap.plot.faithfulness([1, 2]), "expected a Faithfulness"),
])
def test_bad_input_is_a_one_line_error(call, message):
    with pytest.raises(InputError, match=message) as caught:
        call(synthetic.result())
    assert "\n" not in str(caught.value)


def test_one_panel_draws_into_a_given_axes():
    from attnprobe.plot.common import new_figure

    fig = new_figure(4, 3)
    axes = fig.subplots()
    assert ap.plot.faithfulness(synthetic.result(), panel="ranking", ax=axes) is axes
    assert _top_down(axes) == ["saliency", "raw@L1"]
