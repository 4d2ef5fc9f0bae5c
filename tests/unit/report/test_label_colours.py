"""A label rule carries its colour and family: a rule registered at run time (here, in the
test) is drawn in its colour in the head grid, the layer profile and the legend, under its
family, with no report file touched."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from attnprobe.heads import labels
from attnprobe.heads.labels import RULES, LabelRule, classify_scores, layer_profile
from attnprobe.report import build, svg
from attnprobe.types import ModelInfo

INFO = ModelInfo(name="tiny", arch="toy", n_layers=1, n_heads=3, causal=False)


def tilted(row, t):
    value = row.get("tilt")
    return f"tilt={value:g} > 0.5" if value is not None and value > 0.5 else None


@pytest.fixture
def register():
    """Register rules for one test; every one is removed afterwards."""
    added = []

    def add(entry):
        added.append(RULES.add(entry).label)
        return entry

    yield add
    for label in added:
        RULES.remove(label)


def scores():
    return pd.DataFrame([{"stack": "encoder", "kind": "self", "layer": 0, "head": h,
                          "head_id": f"L0H{h}", "tilt": tilt, "prev_nosink": prev}
                         for h, (tilt, prev) in enumerate([(0.9, 0.1), (0.1, 0.9), (0.9, 0.9)])])


def cells(grid):
    """{head id: fill colour} of the head grid's cells."""
    return dict(re.findall(r'<g class="head-cell" data-head="(L\d+H\d+)"><rect [^>]*'
                           r'fill="(#[0-9a-f]{6})"', grid))


def legend(grid):
    """The legend in order: ``(colour, text)`` for a label, ``(None, text)`` for a family."""
    found = re.findall(r'(?:fill="(#[0-9a-f]{6})"/>)?<text[^>]*?( font-weight="bold")?>'
                       r'([^<]*)</text>', grid)
    return [(fill or None, text) for fill, bold, text in found if fill or bold]


def test_a_new_rule_gets_its_colour_in_the_grid_profile_and_legend(register):
    register(LabelRule("tilted", tilted, rank=15, colour="#123456", family="local"))  # first
    classified = classify_scores(scores())
    assert list(classified["label"]) == ["tilted", "previous", "tilted"]
    grid = svg.head_grid(classified)
    assert cells(grid) == {"L0H0": "#123456", "L0H1": RULES.colour("previous"),
                           "L0H2": "#123456"}
    # legend by family, then in precedence order: the new label before "previous"
    assert legend(grid) == [(None, "local (3)"), ("#123456", "tilted (2)"),
                            (RULES.colour("previous"), "previous (1)")]
    chart = svg.layer_profile_chart(layer_profile(classified))
    assert re.search(r'fill="#123456"><title>L0 tilted: 67% of 3 heads</title>', chart)
    page = build(census=classified, info=INFO).html
    assert page.count('fill="#123456"') == 2 + 1 + 2  # two cells, one bar, two legends
    assert "tilted" in svg.palette() and svg.palette()["tilted"] == "#123456"


def test_a_rule_without_a_colour_is_drawn_in_the_fallback_colour(register):
    register(LabelRule("tilted", tilted, rank=15, family="tilts"))
    classified = classify_scores(scores())
    grid = svg.head_grid(classified)
    assert cells(grid)["L0H0"] == svg.UNKNOWN_COLOUR
    # its family comes first: its first label ranks before every other
    assert legend(grid) == [(None, "tilts (2)"), (svg.UNKNOWN_COLOUR, "tilted (2)"),
                            (None, "local (1)"), (RULES.colour("previous"), "previous (1)")]
    page = build(census=classified, info=INFO).html
    assert "sec-heads" in page and "<td>tilts</td>" in page


def test_a_label_no_rule_knows_is_drawn_last_in_the_fallback_colour():
    # e.g. a labels.csv written by a process that had registered an extra rule
    classified = classify_scores(scores())
    classified.loc[0, "label"] = "from-elsewhere"
    grid = svg.head_grid(classified)
    assert cells(grid)["L0H0"] == svg.UNKNOWN_COLOUR
    assert legend(grid) == [(None, "local (2)"), (RULES.colour("previous"), "previous (2)"),
                            (None, "other (1)"), (svg.UNKNOWN_COLOUR, "from-elsewhere (1)")]


def test_the_registry_is_clean_after_these_tests():
    assert "tilted" not in RULES and "tilted" not in labels.PRECEDENCE
