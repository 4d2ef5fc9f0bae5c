"""Report v2: the model view's head panels, figures instead of raw tables (values in their
tooltips), the corpus behind every section, syntax rows above the minimum count, the
checkpoint diff section, and a reproducible page."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from attnprobe.report import build
from tests.unit.report.test_build import INFO, classified, random_map


class Elements(HTMLParser):
    """Start tags with attributes, and the text inside each element with a ``title``."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.titles: list[str] = []
        self._in_title = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, text):
        if self._in_title:
            self.titles.append(text)

    def having(self, tag: str, cls: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and cls in (a.get("class") or "").split()]


def section(html: str, name: str) -> str:
    start = html.index(f'<section id="sec-{name}">')
    return html[start:html.index("</section>", start)]


def sweep_table(n_layers: int = 2, n_heads: int = 3, examples: int = 2) -> pd.DataFrame:
    """A ``perturb.run(..., sweep="head")``-shaped table: change = layer + head / 10 on
    example 0 and twice that on example 1 (mean 1.5 × (layer + head / 10))."""
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            for ex in range(examples):
                change = (layer + head / 10) * (ex + 1)
                rows.append({"experiment": "ablate", "perturbation": "ablate",
                             "scope": f"head:{layer}.{head}", "layer": layer, "head": head,
                             "example_id": str(ex), "step": pd.NA, "metric": "tvd",
                             "baseline": 0.0, "perturbed": change, "change": change})
    table = pd.DataFrame(rows)
    for column in ("layer", "head", "step"):
        table[column] = table[column].astype("Int64")
    return table


def test_head_panels_carry_the_census_label_evidence_and_scores():
    heads = classified(2, 3)
    html = build(maps=[random_map(list("abcd"))], census=heads).html
    page = Elements(section(html, "attention"))
    panels = page.having("div", "ap-detail")
    assert [(int(p["data-layer"]), int(p["data-head"])) for p in panels] == \
        [(la, h) for la in range(2) for h in range(3)]
    assert all("hidden" in p for p in panels)  # shown by a click
    row = heads.set_index("head_id").loc["L1H2"]
    assert panels[5]["data-label"] == row["label"]
    body = section(html, "attention")
    panel = body[body.index('data-layer="1" data-head="2"'):]
    panel = panel[:panel.index("</table>")]
    assert f"L1H2: {row['label']}" in panel
    assert row["evidence"].replace("<", "&lt;").replace(">", "&gt;") in panel
    assert "<th>entropy_norm</th><td>0.7</td>" in panel  # 0.5 + 0.1 * head
    assert page.having("div", "ap-model")  # the thumbnails are drawn there by the script


def test_head_effects_figure_has_one_cell_per_head_with_its_mean_in_the_tooltip():
    html = build(info=INFO, perturbation=sweep_table()).html
    body = section(html, "perturbation")
    page = Elements(body)
    cells = page.having("g", "ap-cell")
    assert [c["data-key"] for c in cells] == [f"L{la}H{h}" for la in range(2) for h in range(3)]
    titles = [t for t in page.titles if t.startswith("L1H2 ")]
    assert len(titles) == 1 and "tvd change 1.8 " in titles[0]  # mean of 1.2 and 2.4
    assert "mean of 2 example(s)" in titles[0]
    assert "Computed on 2 sentence(s)." in body
    # the raw table is still there, collapsed under the figure
    assert re.search(r'<details class="ap-raw"><summary>run table \(12 rows\)</summary>\s*'
                     r'<table class="ap-table">', body)


def test_runs_without_single_head_rows_get_an_effect_per_scope():
    table = sweep_table().assign(scope="layer:0", layer=pd.NA, head=pd.NA)
    page = Elements(section(build(info=INFO, perturbation=table).html, "perturbation"))
    cells = page.having("g", "ap-cell")
    assert len(cells) == 1  # one scope x one metric
    mean = float(np.mean(sweep_table()["change"]))
    assert any(f"tvd mean change {mean:.4g} over 12 row(s)" in t for t in page.titles)


def test_syntax_rows_below_the_minimum_count_are_left_out_and_counted():
    syntax = pd.DataFrame({"relation": ["all", "nsubj", "amod", "rare"],
                           "count": [500, 40, 19, 1], "accuracy": [0.4, 0.8, 0.9, 1.0]})
    body = section(build(info=INFO, syntax=syntax).html, "syntax")
    assert "<td>nsubj</td>" in body and "<td>all</td>" in body
    assert "<td>amod</td>" not in body and "<td>rare</td>" not in body
    assert "relations with at least 20 words (2 rarer left out)." in body
    every = section(build(info=INFO, syntax=syntax, min_count=1).html, "syntax")
    assert "<td>rare</td>" in every and "left out" not in every


def test_figures_fall_back_to_the_table_when_the_columns_are_missing():
    comparison = pd.DataFrame({"source": ["rollout@L1"], "metric": ["spearman"], "mean": [0.3]})
    body = section(build(info=INFO, comparison=comparison).html, "comparison")
    assert "<svg" not in body and "<details" not in body and "<td>rollout@L1</td>" in body


def test_the_same_inputs_give_the_same_page():
    def page():
        return build(maps=[random_map(list("abcde"))], census=classified(),
                     perturbation=sweep_table(), title="t").html
    assert page() == page()


# ---- with a real model: census, comparison, diff ------------------------------------------

@pytest.fixture(scope="module")
def results():
    pytest.importorskip("captum")
    import attnprobe as ap
    from attnprobe.heads import census
    from attnprobe.heads.checkpoint_diff import diff
    from tests.helpers import tiny_bert_classifier

    model, tok = tiny_bert_classifier()
    texts = ["the cat sat on a mat", "a dog ran", "the big red dog sat"]
    return {
        "maps": ap.extract(model, tok, texts[:2]),
        "census": census(model, tok, texts, progress=False),
        "comparison": ap.attribution.compare(model, tok, texts[:2], "class:0",
                                             views=["raw", "rollout"],
                                             methods=["saliency", "leave_one_out"],
                                             progress=False),
        "diff": diff(model, model, tok, texts, progress=False),
    }


def test_every_section_says_how_many_sentences_it_covers(results):
    html = build(maps=results["maps"], census=results["census"],
                 comparison=results["comparison"], syntax=pd.DataFrame(
                     {"relation": ["all"], "count": [30]})).html
    assert "Labels from 3 sentence(s)." in section(html, "heads")
    # attributions ran on the 2 sentences of the attention view, not the census' 3
    assert "Computed on 2 sentence(s) (the attention view's), of the 3 the labels come from." \
        in unescape(section(html, "comparison"))
    assert "From 3 sentence(s); relations with at least 20 words." in section(html, "syntax")


def test_comparison_figures_replace_the_summary_table(results):
    body = section(build(comparison=results["comparison"], info=INFO).html, "comparison")
    page = Elements(body)
    summary = results["comparison"].summary()
    tau = summary[(summary["metric"] == "kendall_tau") & (summary["source"] == "rollout@L1")
                  & (summary["method"] == "saliency")].iloc[0]
    assert any(t.startswith(f"rollout L1 vs saliency: kendall_tau {tau['mean']:.4g}")
               for t in page.titles)
    assert len([t for t, _ in page.tags if t == "polyline"]) == 2 * 2  # views x methods
    # token heat: one row per method and view, one cell per token, of each example
    tokens = len(results["maps"][0].query_tokens) + len(results["maps"][1].query_tokens)
    rows = 2 + 2 * 2  # saliency, leave_one_out, and raw / rollout at layers 0 and 1
    assert len(page.having("g", "ap-cell")) == tokens * rows
    assert '<details class="ap-raw"><summary>agreement table' in body


def test_diff_section_has_a_figure_per_head(results):
    html = build(diff=results["diff"], info=INFO).html
    body = section(html, "diff")
    page = Elements(body)
    keys = [c["data-key"] for c in page.having("g", "ap-cell")]
    assert keys == [f"L{la}H{h}" for la in range(2) for h in range(2)] * 2  # JS, label change
    assert "Both models on the same 3 sentence(s); 0 of 4 head labels changed." in body
    assert any(t.startswith("L1H0: ") and "JS 0 nats" in t for t in page.titles)
