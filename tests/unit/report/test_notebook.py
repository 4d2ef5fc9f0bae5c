"""``_repr_html_`` of every result: self-contained fragments (no URL), every string escaped,
unique ids so several share a page, one guarded script; the perturbation table stays a plain
DataFrame; ``import attnprobe`` still imports no jinja2."""

from __future__ import annotations

import re
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch

from attnprobe.core import html_view
from attnprobe.report import build
from attnprobe.types import AttentionMap, ModelInfo
from tests.unit.report.test_report_v2 import sweep_table

EVIL = "<script>alert(1)</script>"
RLO = "\u202e"
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


class Parsed(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def assert_safe(html: str) -> Parsed:
    """No URL, no raw hostile token or bidi control, only our two kinds of script."""
    assert not re.search(r"https?:", html, flags=re.IGNORECASE)
    assert not re.search(r"//[a-z0-9.-]+\.[a-z]{2,}", html, flags=re.IGNORECASE)
    for attr in re.findall(r"\b(?:src|href|xlink:href|action)\s*=\s*[\"']?([^\"'\s>]*)", html,
                           flags=re.IGNORECASE):
        assert attr.startswith(("data:", "#")), attr
    assert EVIL not in html and not set(html) & BIDI
    page = Parsed(html)
    for tag, attrs in page.tags:
        assert not [name for name in attrs if name.startswith("on")]
        if tag == "script":
            assert attrs in ({}, {"type": "application/json", "id": attrs.get("id")})
    return page


def evil_map(example_id: str = EVIL) -> AttentionMap:
    tokens = ("[CLS]", EVIL, RLO + "abc", "[SEP]")
    info = ModelInfo(name="toy" + EVIL, arch="toy", n_layers=2, n_heads=3, causal=False)
    pattern = torch.softmax(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)),
                            dim=-1)
    return AttentionMap(pattern=pattern, query_tokens=tokens, key_tokens=tokens, layers=(0, 1),
                        info=info, example_id=example_id)


def test_attention_map_view_is_self_contained_and_escaped():
    html = evil_map()._repr_html_()
    page = assert_safe(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;: 4 × 4 tokens, 2 layer(s) × 3 head(s)" in html
    root = [a for t, a in page.tags if t == "div" and "ap-view" in (a.get("class") or "")]
    assert len(root) == 1 and root[0]["data-maps"] == root[0]["id"][:-len("view")] + "maps"
    data = re.search(r'<script type="application/json" id="([a-z0-9-]+)">(.*?)</script>', html)
    assert data.group(1) == root[0]["data-maps"]
    assert "\\u003cscript\\u003e" in data.group(2)  # the token, escaped in the JSON
    assert "if(!window.attnprobeViews)" in html  # the views are defined once per page


def test_several_fragments_on_one_page_have_distinct_ids():
    fragments = [evil_map()._repr_html_(), evil_map("b")._repr_html_(),
                 html_view.attach(sweep_table(), "perturbation")._repr_html_()]
    ids = [a["id"] for t, a in Parsed("".join(fragments)).tags if "id" in a]
    assert len(ids) == len(set(ids)) == 2 * 3 + 1  # (root, view, maps) x 2 maps + a root


def test_perturbation_table_stays_a_dataframe_and_shows_the_effect_per_head():
    table = html_view.attach(sweep_table().assign(experiment=EVIL), "perturbation")
    assert type(table) is pd.DataFrame
    html = table._repr_html_()
    assert_safe(html)
    assert html.count('class="ap-cell"') == 2 * 3
    assert "L1H2 &lt;script&gt;alert(1)&lt;/script&gt;: tvd change 1.8 " in html
    derived = table[table["layer"] == 0]
    assert type(derived) is pd.DataFrame and "ap-cell" not in derived._repr_html_()


def test_run_returns_a_plain_dataframe_with_the_head_view(classifier):
    import attnprobe as ap

    model, tok = classifier
    table = ap.perturb.run(model, tok, ["the cat sat", "a dog ran"], "uniform", sweep="head",
                           progress=False)
    assert type(table) is pd.DataFrame
    metrics = table["metric"].nunique()
    assert table._repr_html_().count('class="ap-cell"') == 2 * 2 * metrics  # layers x heads


def test_report_is_a_sandboxed_frame_holding_the_page():
    report = build(maps=[evil_map()], title=EVIL)
    html = report._repr_html_()
    page = assert_safe(html)
    assert "<script" not in html  # the page's scripts live in the frame's document only
    (frame,) = [a for t, a in page.tags if t == "iframe"]
    assert frame["sandbox"] == "allow-scripts" and frame["srcdoc"] == report.html
    assert unescape(re.search(r'srcdoc="([^"]*)"', html).group(1)) == report.html


@pytest.fixture(scope="module")
def classifier():
    from tests.helpers import tiny_bert_classifier

    return tiny_bert_classifier("the cat sat on a mat dog ran big red < > script alert")


def test_census_comparison_and_diff_views(classifier):
    pytest.importorskip("captum")
    import attnprobe as ap
    from attnprobe.heads import census
    from attnprobe.heads.checkpoint_diff import diff

    model, tok = classifier
    texts = ["the <script> cat sat", "a dog ran"]
    result = census(model, tok, texts, progress=False)
    html = result._repr_html_()
    assert_safe(html)
    assert "Labels from 2 sentence(s)." in html and html.count('class="head-cell"') == 4
    labels = result.classify()
    assert f"<td>{labels['label'].iloc[0]}</td>" in html  # the label table

    comparison = ap.attribution.compare(model, tok, texts, "class:0", views=["raw"],
                                        methods=["saliency"], progress=False)
    html = comparison._repr_html_()
    assert_safe(html)
    assert "Computed on 2 sentence(s)." in html
    assert "<text" in html and ">&lt;</text>" in html  # the "<" token, escaped on the axis
    assert "<polyline" in html

    changed = diff(model, model, tok, texts, progress=False)
    html = changed._repr_html_()
    assert_safe(html)
    assert "Both models on the same 2 sentence(s)" in html
    assert html.count('data-key="L0H1"') == 2  # JS and label-change figures


def test_import_attnprobe_imports_no_jinja2_and_views_load_on_use():
    code = ("import sys, attnprobe, attnprobe.perturb; "
            "print(sorted(m for m in ('jinja2', 'attnprobe.report', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
