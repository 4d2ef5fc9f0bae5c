"""Every string that reaches the page is escaped or slugified, attributes included; bidi
controls are shown, never obeyed; the page is written atomically; jinja2 missing is a clear
error. The page is read back with the standard library's HTML parser, so the checks see what a
browser's tokenizer sees, not what a regular expression happens to match."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from importlib import resources

import pandas as pd
import pytest
import torch

from attnprobe.errors import InputError, OutputError
from attnprobe.report import Report, build, data
from attnprobe.report.text import show_controls, slug
from attnprobe.types import AttentionMap, ModelInfo

EVIL_KEY = 'x"><script>alert(1)</script>'
RLO = "\u202e"
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
INFO = ModelInfo(name="tiny" + RLO, arch="toy", n_layers=1, n_heads=2, causal=False)


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text of every element."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, text):
        self.text.append(text)

    def ids(self) -> list[str]:
        return [attrs["id"] for _, attrs in self.tags if "id" in attrs]


def amap(tokens, example_id=""):
    n = len(tokens)
    return AttentionMap(pattern=torch.full((1, 2, n, n), 1 / n), query_tokens=tuple(tokens),
                        key_tokens=tuple(tokens), layers=(0,), info=INFO, example_id=example_id)


def hostile_page() -> str:
    classified = pd.DataFrame({
        "stack": ["e", "e"], "kind": ["self", "self"], "layer": [0, 0], "head": [0, 1],
        "head_id": ['L0H0" onmouseover="alert(1)', "L0H1" + RLO], "label": ["previous", "sink"],
        "evidence": ["<b>x</b>", "y"], "also": ["", ""], "prev": [0.9, 0.1]})
    table = pd.DataFrame({EVIL_KEY: [EVIL_KEY, RLO + "cell"], "n": [1.23456, float("nan")]})
    return build(maps=[amap(["[CLS]", EVIL_KEY, RLO + "abc", "[SEP]"], example_id=RLO + "s")],
                 census=classified, title=EVIL_KEY + RLO,
                 tables=[(EVIL_KEY, EVIL_KEY, table)]).html


# ---- attributes and ids -------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "expected"), [
    ("label-counts", "label-counts"), ("Jain & Wallace", "jain-wallace"),
    ("under_score 2", "under_score-2"), (EVIL_KEY, "x-script-alert-1-script"),
    ("é", None), ("!!!", None), (3, None),
])
def test_slug(key, expected):
    if expected is None:
        with pytest.raises(InputError, match="key"):
            slug(key)
    else:
        assert slug(key) == expected


def test_hostile_strings_never_become_markup():
    page = Tags(hostile_page())
    scripts = [attrs for tag, attrs in page.tags if tag == "script"]
    assert scripts == [{"type": "application/json", "id": "ap-maps"}, {}]
    assert not [name for _, attrs in page.tags for name in attrs if name.startswith("on")]
    assert page.ids() == ["sec-model", "sec-heads", "sec-profile", "sec-attention", "ap-view",
                          "sec-x-script-alert-1-script", "ap-maps"]
    cells = [attrs["data-head"] for tag, attrs in page.tags if tag == "g"]
    assert cells == ['L0H0" onmouseover="alert(1)', "L0H1\u27e8U+202E\u27e9"]
    assert {tag for tag, _ in page.tags} <= {
        "html", "head", "meta", "title", "style", "body", "h1", "section", "h2", "dl", "dt", "dd",
        "ol", "li", "bdi", "small", "div", "svg", "text", "g", "rect", "select",
        "label", "p", "table", "thead", "tbody", "tr", "th", "td", "script",
        "h3"}  # h3: the head panels of the model view
    text = "".join(page.text)
    assert EVIL_KEY in text  # shown, as text: title, heading, column, cell
    assert "<b>x</b>" in text  # the evidence, in a tooltip


def test_no_bidi_control_anywhere_in_the_page():
    html = hostile_page()
    assert not set(html) & BIDI
    assert "\u27e8U+202E\u27e9abc" in html and "\\u202e" in html  # visible; escaped in JSON
    assert data.read_script_json(html, "ap-maps")[0]["query_tokens"][2] == RLO + "abc"


def test_each_card_token_is_its_own_isolate():
    page = Tags(build(maps=[amap(["a", RLO + "b", "c"], example_id="s")]).html)
    bdi = [i for i, (tag, _) in enumerate(page.tags) if tag == "bdi"]
    assert len(bdi) == 1 + 3  # the example id and each token


def test_show_controls():
    # U+200F (a mark, not an embedding or isolate) is left alone
    assert show_controls("a\u202ab\u2069c\u200fd") == \
        "a\u27e8U+202A\u27e9b\u27e8U+2069\u27e9c\u200fd"
    assert show_controls("plain") == "plain"


# ---- sections ---------------------------------------------------------------------------------

def test_table_keys_must_give_distinct_ids():
    frame = pd.DataFrame({"a": [1]})
    with pytest.raises(InputError, match="sec-syntax"):
        build(syntax=frame, tables=[("Syntax", "mine", frame)])
    with pytest.raises(InputError, match="sec-a-b"):
        build(tables=[("A b", "one", frame), ("a-b", "two", frame)])
    with pytest.raises(InputError, match="triples"):
        build(tables=[("a", frame)])
    with pytest.raises(InputError, match="DataFrame"):
        build(tables=[("a", "h", [1, 2])])
    # empty and missing tables are left out and take no id
    html = build(info=INFO, tables=[("a", "h", None), ("b", "h", pd.DataFrame()),
                                    ("c", "h", frame)]).html
    assert Tags(html).ids() == ["sec-model", "sec-c"]


def test_table_cells():
    frame = pd.DataFrame({"f": [1 / 3, float("nan"), 2.0], "s": ["<i>", None, "x"],
                          "i": [1, 2, 3]})
    frame["g"] = pd.Series([2 / 3, 0.5, float("nan")], dtype="float32")
    html = build(tables=[("t", "T", frame)], info=INFO).html
    rows = html[html.index("<tbody>"):html.index("</tbody>")]
    assert rows.count("<tr>") == 3
    assert "<td>0.3333</td><td>&lt;i&gt;</td><td>1</td><td>0.6667</td>" in rows
    assert "<td></td><td></td><td>2</td><td>0.5</td>" in rows
    assert "<td>2</td><td>x</td><td>3</td><td></td>" in rows


def test_long_tables_are_cut_with_a_note():
    html = build(tables=[("t", "T", pd.DataFrame({"v": range(503)}))], info=INFO).html
    assert html.count("<td>") == 500 and "first 500 of 503 rows" in html


# ---- saving -------------------------------------------------------------------------------------

def test_save_is_atomic(tmp_path):
    path = tmp_path / "r.html"
    Report(html="<p>old</p>").save(path)
    with pytest.raises(UnicodeEncodeError):
        Report(html="<p>new \ud800</p>").save(path)  # fails half-way through the write
    assert path.read_text(encoding="utf-8") == "<p>old</p>"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left
    with pytest.raises(OutputError, match="directory"):
        Report(html="x").save(tmp_path)


# ---- packaging --------------------------------------------------------------------------------

def test_templates_and_assets_are_flat_package_data():
    # pyproject ships report/templates/* and report/static/*: one level, no sub-folders
    root = resources.files("attnprobe.report")
    for folder in ("templates", "static"):
        entries = list(root.joinpath(folder).iterdir())
        assert entries and all(entry.is_file() for entry in entries), folder


def test_missing_jinja2_is_a_missing_extra_error():
    code = """
import sys
sys.modules["jinja2"] = None  # as if the report extra were not installed
import attnprobe as ap
from attnprobe.errors import MissingExtraError
from attnprobe.report import build, to_bertviz  # importing is fine; the BertViz export too
info = ap.ModelInfo(name="t", arch="t", n_layers=1, n_heads=1, causal=False)
try:
    build(info=info)
except MissingExtraError as err:
    print(err)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "jinja2 is not installed; run: pip install 'attnprobe[report]'"
