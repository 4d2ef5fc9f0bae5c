"""The notebook view of a patching table: self-contained, escaped, a heatmap cell per head
(or per head and position) titled with its mean effect, the notes about pairs without a
difference, and the table itself still a plain DataFrame."""

from __future__ import annotations

import re
import warnings

import pandas as pd

import attnprobe as ap
from tests.unit.report.test_notebook import EVIL, assert_safe

CLEAN = [[2, 5, 6, 7, 8, 9, 5, 6, 7, 8], [2, 5, 6, 7, 8, 9, 5, 6, 7, 8]]
CORRUPT = [[2, 13, 12, 11, 10, 9, 5, 6, 7, 8], [2, 5, 6, 7, 8, 9, 5, 6, 7, 8]]


def test_a_heads_table_shows_one_cell_per_head_and_the_note():
    model, tok = ap.load_model("ref:induction")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pair 1 has no corruption: its effect is NaN
        table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next",
                               metric_positions=[6, 7, 8])
    assert type(table) is pd.DataFrame
    html = table._repr_html_()
    assert_safe(html)
    cells = re.findall(r'data-key="(L\dH\d)"', html)
    assert sorted(set(cells)) == [f"L{la}H{h}" for la in range(2) for h in range(4)]
    assert "mean of 1 example(s)" in html  # the NaN pair is left out of the means
    assert "examples 1: metric &#39;logit:next(clean)&#39; is equal" in html or \
        "examples 1: metric 'logit:next(clean)' is equal" in html
    assert "(patched − corrupt)/(clean − corrupt)" in html


def test_each_position_and_hostile_metric_names_are_escaped():
    model, tok = ap.load_model("ref:induction")

    def metric(output, batch):
        return output[:, 7, 5]

    table = ap.patch.heads(model, tok, CLEAN[:1], CORRUPT[:1], metric, scope="layer:1",
                           positions="each")
    table["metric"] = EVIL
    html = table._repr_html_()
    assert_safe(html)
    assert "L1H3 at position 9" in html
