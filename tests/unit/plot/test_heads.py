"""head_grid, layer_profile and head_clusters: label colours from RULES, legends in precedence
order, cells / bars / points equal to the table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer

from attnprobe.errors import InputError
from attnprobe.heads import census
from attnprobe.heads.label_rules import RULES
from attnprobe.plot import head_clusters, head_grid, layer_profile
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert
from tests.unit.plot.drawn import image, points, render, rgb, ticks

PRECEDENCE = RULES.precedence()
A, B, C = PRECEDENCE[0], PRECEDENCE[2], PRECEDENCE[-1]  # e.g. sink, next, heterogeneous
# layer × head labels (layer 2 has no head 3: a partial table)
GRID = {0: [C, A, A, B], 1: [B, B, C, A], 2: [A, C, C]}


def classified(grid=GRID, **extra) -> pd.DataFrame:
    rows = [{"stack": "encoder", "kind": "self", "layer": layer, "head": head,
             "head_id": f"L{layer}H{head}", "label": label, **extra}
            for layer, labels in grid.items() for head, label in enumerate(labels)]
    return pd.DataFrame(rows)


def test_head_grid_colours_every_cell_by_its_label():
    fig = head_grid(classified())
    ax = fig.axes[0]
    render(fig)
    cells = image(ax)
    assert cells.shape == (3, 4, 4)
    for layer, labels in GRID.items():
        for head, label in enumerate(labels):
            np.testing.assert_allclose(cells[layer, head, :3], rgb(RULES.colour(label)))
            assert cells[layer, head, 3] == 1.0
    assert cells[2, 3, 3] == 0.0  # the missing head is transparent
    assert ticks(ax, "x") == ["0", "1", "2", "3"] and ticks(ax, "y") == ["0", "1", "2"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [A, B, C]  # precedence order
    assert [h.get_facecolor()[:3] for h in ax.get_legend().legend_handles] == \
        [pytest.approx(rgb(RULES.colour(v))) for v in legend]
    assert len(ax.texts) == 11  # one short label per head


def test_head_grid_colours_any_categorical_column_such_as_family():
    table = classified()
    table["family"] = np.where(table["label"] == A, "global", "local")
    ax = head_grid(table, by="family", annotate=False).axes[0]
    cells = image(ax)
    assert not np.allclose(cells[0, 1, :3], cells[0, 0, :3])  # global vs local
    np.testing.assert_allclose(cells[0, 1, :3], cells[1, 3, :3])  # both global
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["global", "local"]


def test_layer_profile_stacks_the_label_shares_in_precedence_order():
    fig = layer_profile(classified())
    ax = fig.axes[0]
    render(fig)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [b.get_label() for b in bars] == [A, B, C]
    expected = {A: [0.5, 0.25, 1 / 3], B: [0.25, 0.5, 0.0], C: [0.25, 0.25, 2 / 3]}
    bottom = np.zeros(3)
    for bar in bars:
        heights = [p.get_height() for p in bar.patches]
        np.testing.assert_allclose(heights, expected[bar.get_label()])
        np.testing.assert_allclose([p.get_y() for p in bar.patches], bottom)
        bottom += heights
        assert bar.patches[0].get_facecolor()[:3] == pytest.approx(
            rgb(RULES.colour(bar.get_label())))
    np.testing.assert_allclose(bottom, 1.0)


def test_layer_profile_reads_the_profile_table_too():
    from attnprobe.heads import layer_profile as profile_table

    ax = layer_profile(profile_table(classified())).axes[0]
    heights = {b.get_label(): [p.get_height() for p in b.patches] for b in ax.containers}
    np.testing.assert_allclose(heights[A], [0.5, 0.25, 1 / 3])


def clusters() -> pd.DataFrame:
    table = classified()
    return table.assign(cluster=[1, 1, 2, 2, 1, 3, 3, 2, 1, 2, 3],
                        x=np.arange(11.0), y=np.arange(11.0) ** 2)


def test_head_clusters_places_heads_at_their_coordinates_coloured_by_label():
    table = clusters()
    fig = head_clusters(table)
    ax = fig.axes[0]
    render(fig)
    xy, colours = points(ax)
    order = np.lexsort((table["x"], table["cluster"]))  # drawn cluster by cluster
    np.testing.assert_allclose(xy, table[["x", "y"]].to_numpy()[order])
    expected = [rgb(RULES.colour(v)) for v in table["label"].to_numpy()[order]]
    np.testing.assert_allclose(colours, expected)
    markers = {c.get_paths()[0].vertices.shape for c in ax.collections}
    assert len(markers) == 3  # one shape per cluster
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [A, B, C, "cluster 1", "cluster 2", "cluster 3"]
    assert {t.get_text() for t in ax.texts} == set(table["head_id"])


def test_head_clusters_takes_the_labels_from_another_table():
    table = clusters()
    xy, colours = points(head_clusters(table.drop(columns="label"),
                                       labels=classified()).axes[0])
    assert len(xy) == 11
    assert {tuple(c) for c in colours} == {rgb(RULES.colour(v)) for v in (A, B, C)}


def test_real_census_figures_match_its_tables():
    vocab = bert_vocab()
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)
    result = census(model, tok, ["the cat sat on a mat", "a big dog ran", "the red cat ran"],
                    repeated=False)
    table = result.classify()
    cells = image(head_grid(result).axes[0])
    for row in table.itertuples():
        np.testing.assert_allclose(cells[row.layer, row.head, :3], rgb(RULES.colour(row.label)))
    ax = layer_profile(result).axes[0]
    total = sum(np.array([p.get_height() for p in b.patches]) for b in ax.containers)
    np.testing.assert_allclose(total, 1.0)
    fig = head_clusters(result, n_clusters=2)
    render(fig, "svg")
    xy, _ = points(fig.axes[0])
    assert len(xy) == len(table) == 4


@pytest.mark.parametrize(("call", "message"), [
    (lambda: head_grid(classified().iloc[:0]), "empty"),
    (lambda: head_grid(classified().drop(columns="label")), "lacks column"),
    (lambda: head_grid(pd.concat([classified(), classified()])), "more than once"),
    (lambda: head_grid(classified().assign(stack=["a", "b"] * 5 + ["a"])),
     "several stacks"),
    (lambda: head_grid(42), "expected a Census"),
    (lambda: layer_profile(classified(), by="family"), "lacks column"),
    (lambda: head_clusters(classified()), "lacks column"),
])
def test_bad_input_is_a_one_line_error(call, message):
    with pytest.raises(InputError, match=message):
        call()


def test_stack_picks_one_attention_stack():
    table = pd.concat([classified(), classified().assign(stack="decoder")])
    cells = image(head_grid(table, stack="decoder").axes[0])
    assert cells.shape == (3, 4, 4)
