"""A huge token cannot stretch the page (issue 17): the report and the notebook view show at
most ``TOKEN_CHARS`` characters of a token, ending in "…", with the whole token in a tooltip,
and every width they set stays bounded. The page is read back with the standard library's HTML
parser; what the attention views' script draws is measured in a real browser by
``tests/integration/test_report_browser.py``."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import resources

import numpy as np
import torch

import attnprobe as ap
from attnprobe.report import charts
from attnprobe.types import AttentionMap, ModelInfo

TOKEN_CHARS = 32  # templates/tokens.j2
LONG = "Q" * 10_000
TOKENS = ("[CLS]", "the", LONG, "cat", "[SEP]")
INFO = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=2, causal=False)
MAX_PX = 2_000  # any width a page sets for a handful of tokens


class Shown(HTMLParser):
    """What a page shows as text (outside scripts and tooltips), its tooltips, and the widths
    it sets in attributes and inline styles."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.tips: list[str] = []
        self.widths: list[float] = []
        self.hidden: list[str] = []  # open <script> / <title> elements
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "title"):
            self.hidden.append(tag)
        for name, value in attrs:
            if name == "title":
                self.tips.append(value or "")
            elif name == "width":
                self.widths.append(float(value))
            elif name == "style":
                self.widths += [float(px) for px in re.findall(r"width:\s*([\d.]+)px", value)]
            elif name.startswith("data-") or name in ("srcdoc",):
                continue
            else:
                self.text.append(value or "")

    def handle_endtag(self, tag):
        if self.hidden and self.hidden[-1] == tag:
            self.hidden.pop()

    def handle_data(self, data):
        (self.tips if self.hidden and self.hidden[-1] == "title" else
         [] if self.hidden else self.text).append(data)

    def longest_run(self, char: str) -> int:
        return max((len(m) for t in self.text for m in re.findall(f"{char}+", t)), default=0)


def long_map() -> AttentionMap:
    n = len(TOKENS)
    pattern = torch.stack([torch.eye(n), torch.full((n, n), 1 / n)])[None]  # [1, 2, n, n]
    return AttentionMap(pattern=pattern, query_tokens=TOKENS, key_tokens=TOKENS, layers=(0,),
                        info=INFO)


def test_the_report_cuts_a_huge_token_and_keeps_it_whole_in_a_tooltip():
    page = Shown(ap.report.build(maps=[long_map()]).html)
    assert page.longest_run("Q") == TOKEN_CHARS - 1
    assert "Q" * (TOKEN_CHARS - 1) + "…" in "".join(page.text)
    assert LONG in page.tips
    assert page.widths and max(page.widths) <= MAX_PX


def test_the_notebook_view_sets_no_unbounded_width_and_shows_no_huge_token():
    view = Shown(long_map()._repr_html_())
    assert view.longest_run("Q") <= TOKEN_CHARS
    assert all(w <= MAX_PX for w in view.widths)
    # the views' script cuts tokens to the cap its frame names
    assert f'data-token-chars="{TOKEN_CHARS}"' in long_map()._repr_html_()


def test_a_token_in_a_heatmap_column_is_cut_with_a_tooltip():
    tips = [[f"{name}: 1" for name in (LONG, "cat")]]
    svg = Shown(str(charts.heatmap(np.ones((1, 2)), ["saliency"], [LONG, "cat"], tips,
                                   caption="score", rotate_columns=True)))
    assert svg.longest_run("Q") == TOKEN_CHARS - 1
    assert LONG in svg.tips and "cat" in svg.text
    assert max(svg.widths) <= MAX_PX


def test_short_tokens_are_shown_whole_without_a_tooltip():
    tokens = ("[CLS]", "Q" * TOKEN_CHARS, "[SEP]")
    n = len(tokens)
    amap = AttentionMap(pattern=torch.full((1, 1, n, n), 1 / n), query_tokens=tokens,
                        key_tokens=tokens, layers=(0,), info=INFO)
    page = Shown(ap.report.build(maps=[amap]).html)
    assert page.longest_run("Q") == TOKEN_CHARS
    assert not any("Q" in tip for tip in page.tips)


def test_the_token_cells_of_the_views_are_bounded_in_css():
    css = resources.files("attnprobe.report").joinpath("static", "views.css").read_text()
    rule = re.search(r"\.ap-view \.tok\{([^}]*)\}", css).group(1)
    assert re.search(r"max-width:\d+(\.\d+)?em", rule)
    assert "overflow:hidden" in rule and "text-overflow:ellipsis" in rule
