"""offset_profile and syntax_accuracy draw the census tables' numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer

from attnprobe.errors import InputError
from attnprobe.heads import census, read_conllu
from attnprobe.heads.label_rules import RULES
from attnprobe.plot import offset_profile, syntax_accuracy
from attnprobe.plot.syntax import BASELINE_COLOUR
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert
from tests.unit.plot.drawn import mesh, render, rgb, ticks


def offsets() -> pd.DataFrame:
    rows = []
    for layer in (0, 1):
        for head in (0, 1, 2):
            for offset in range(-12, 13):
                mass = 1.0 / (1 + abs(offset + layer - head)) + 0.01 * head
                rows.append({"stack": "", "kind": "self", "layer": layer, "head": head,
                             "head_id": f"L{layer}H{head}", "offset": offset, "mass": mass,
                             "argmax_share": float(offset == head - layer)})
    return pd.DataFrame(rows)


def test_offset_profile_is_a_heads_by_offsets_heatmap_of_the_mass():
    table = offsets()
    fig = offset_profile(table, window=3)
    ax = fig.axes[0]
    render(fig)
    cells = mesh(ax)
    assert cells.shape == (6, 7)
    assert ticks(ax, "x") == ["-3", "-2", "-1", "0", "+1", "+2", "+3"]
    assert ticks(ax, "y") == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    near = table[table["offset"].abs() <= 3]
    for r, (layer, head) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]):
        row = near[(near["layer"] == layer) & (near["head"] == head)].sort_values("offset")
        np.testing.assert_allclose(cells[r], row["mass"])


def test_offset_profile_scope_value_and_unseen_offsets():
    table = offsets()
    table = table[~((table["layer"] == 1) & (table["head"] == 1) & (table["offset"] == 2))]
    ax = offset_profile(table, scope="layer:1", value="argmax_share", window=None).axes[0]
    cells = mesh(ax)
    assert cells.shape == (3, 25)
    assert ticks(ax, "y") == ["L1H0", "L1H1", "L1H2"]
    assert np.isnan(cells[1, 12 + 2]) and not np.isnan(cells[[0, 2], 12 + 2]).any()  # unseen
    np.testing.assert_allclose(np.nansum(cells, axis=1), 1.0)  # one argmax offset per head


def syntax_table() -> pd.DataFrame:
    return pd.DataFrame({
        "relation": ["all", "det", "nsubj", "amod"], "count": [120, 40, 25, 3],
        "direction": ["head->dep", "dep->head", "dep->head", "head->dep"],
        "stack": "", "kind": "self", "layer": [1, 2, 0, 1], "head": [0, 3, 1, 1],
        "head_id": ["L1H0", "L2H3", "L0H1", "L1H1"], "accuracy": [0.4, 0.85, 0.6, 1.0],
        "baseline": [0.35, 0.64, 0.62, 1.0], "baseline_offset": [1, 1, -1, 2],
        "margin": [0.05, 0.21, -0.02, 0.0]})


def test_syntax_accuracy_bars_are_head_and_baseline_accuracy_per_relation():
    fig = syntax_accuracy(syntax_table())
    ax = fig.axes[0]
    render(fig)
    heads, base = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [p.get_height() for p in heads.patches] == [0.4, 0.85, 0.6]  # amod: 3 < 20 arcs
    assert [p.get_height() for p in base.patches] == [0.35, 0.64, 0.62]
    assert heads.patches[0].get_facecolor()[:3] == pytest.approx(rgb(RULES.colour("syntactic")))
    assert base.patches[0].get_facecolor()[:3] == pytest.approx(rgb(BASELINE_COLOUR))
    assert [t.split("\n") for t in ticks(ax)] == [["all", "n=120"], ["det", "n=40"],
                                                   ["nsubj", "n=25"]]
    texts = [t.get_text() for t in ax.texts]
    assert {"L1H0", "L2H3", "L0H1", "+1", "-1"} <= set(texts)


def test_syntax_accuracy_min_count_and_relations():
    ax = syntax_accuracy(syntax_table(), min_count=1, relations=["amod", "det"]).axes[0]
    assert [t.split("\n")[0] for t in ticks(ax)] == ["amod", "det"]
    with pytest.raises(InputError, match="lower min_count"):
        syntax_accuracy(syntax_table(), min_count=500)
    with pytest.raises(InputError, match="no relation"):
        syntax_accuracy(syntax_table(), relations=["amod"])


def test_real_census_offsets_and_syntax():
    vocab = bert_vocab("the cat sat on a mat dog ran big red she gave children warm blanket "
                       "mice saw was quickly and . , in")
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)
    trees = read_conllu("tests/data/mini.conllu")
    result = census(model, tok, trees=trees, repeated=False, similarity=False)
    table = result.offsets()
    cells = mesh(offset_profile(result, window=2).axes[0])
    near = table[table["offset"].abs() <= 2].sort_values(["layer", "head", "offset"])
    np.testing.assert_allclose(cells.ravel(), near["mass"], rtol=1e-6)
    syntax = result.syntax(1)
    ax = syntax_accuracy(result, min_count=1).axes[0]
    np.testing.assert_allclose([p.get_height() for p in ax.containers[0].patches],
                               syntax["accuracy"])
