"""patching_effect: the mean effect per patch as a layer × head heatmap (heads × positions for
positions="each"), read back from what was drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.plot import patching_effect
from tests.unit.plot.drawn import mesh, render, ticks


def table(positions: bool = False, **fixed) -> pd.DataFrame:
    """A patching table with effect ``0.1·layer + 0.01·head (+ 0.001·position) + 0.002·example``
    for 2 layers × 3 heads × 2 examples."""
    rows = []
    for layer in range(2):
        for head in range(3):
            for position in (range(4) if positions else [None]):
                for example in range(2):
                    e = 0.1 * layer + 0.01 * head + 0.002 * example + 0.001 * (position or 0)
                    rows.append({"experiment": "heads", "example_id": str(example),
                                 "layer": layer, "head": head, "position": position,
                                 "site": "output", "direction": "denoising",
                                 "metric": "logit:next", "clean": 1.0, "corrupt": 0.0,
                                 "patched": e, "effect": e, **fixed})
    frame = pd.DataFrame(rows)
    frame["position"] = frame["position"].astype("Int64")
    return frame


def test_layer_by_head_cells_are_the_mean_effect_over_examples():
    fig = patching_effect(table())
    ax = fig.axes[0]
    want = np.array([[0.1 * la + 0.01 * h + 0.001 for h in range(3)] for la in range(2)])
    np.testing.assert_allclose(mesh(ax).reshape(2, 3), want)
    assert ticks(ax, "x") == ["0", "1", "2"] and ticks(ax, "y") == ["0", "1"]
    assert "2 example(s)" in ax.get_title() and "denoising" in ax.get_title()
    render(fig)


def test_each_position_gives_heads_by_positions():
    fig = patching_effect(table(positions=True))
    ax = fig.axes[0]
    values = mesh(ax).reshape(6, 4)
    assert ticks(ax, "y") == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    assert ticks(ax, "x") == ["0", "1", "2", "3"] and ax.get_xlabel() == "position"
    np.testing.assert_allclose(values[4, 3], 0.1 + 0.01 + 0.001 + 0.003)
    render(fig)


def test_patches_over_several_heads_get_an_all_column():
    frame = table()
    whole = frame[frame["head"] == 0].assign(head=pd.NA)
    frame = pd.concat([frame, whole]).astype({"head": "Int64"})
    ax = patching_effect(frame).axes[0]
    assert ticks(ax, "x") == ["0", "1", "2", "all"]


def test_a_mixed_table_asks_which_rows():
    frame = pd.concat([table(), table().assign(site="q")])
    with pytest.raises(InputError, match=r"several sites \['output', 'q'\]; pass site="):
        patching_effect(frame)
    ax = patching_effect(frame, site="q").axes[0]
    assert "q" in ax.get_title()
    with pytest.raises(InputError, match="lacks column"):
        patching_effect(frame.drop(columns="effect"))


def test_a_choice_the_table_cannot_make_is_refused():
    """A choice on a column the table lacks used to be ignored: the figure then claimed to
    show one experiment while it showed whatever the table held."""
    frame = table().drop(columns="experiment")
    with pytest.raises(InputError, match=r"^patching table has no 'experiment' column"):
        patching_effect(frame, experiment="path")
    assert "heads" not in patching_effect(frame).axes[0].get_title()  # no choice: fine


def test_a_real_run_and_its_summary_draw_the_same():
    model, tok = ap.load_model("ref:induction")
    clean = [[2, 5, 6, 7, 8, 9, 5, 6, 7, 8]]
    corrupt = [[2, 13, 12, 11, 10, 9, 5, 6, 7, 8]]
    run = ap.patch.path(model, tok, clean, corrupt, "logit:next", metric_positions=[6, 7, 8],
                        senders="layer:0", receivers="layer:1", into="k")
    a = mesh(patching_effect(run).axes[0])
    b = mesh(patching_effect(ap.patch.summary(run)).axes[0])
    np.testing.assert_allclose(a, b)
    assert a.size == 4  # one layer of senders x 4 heads
