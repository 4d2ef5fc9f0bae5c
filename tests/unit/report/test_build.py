import re

import numpy as np
import pandas as pd
import pytest
import torch

from attnprobe.heads.labels import PRECEDENCE, classify_scores, layer_profile
from attnprobe.report import build, data, svg
from attnprobe.types import AttentionMap, ModelInfo

EVIL = "<script>alert(1)</script>"
INFO = ModelInfo(name="tiny", arch="BertModel", n_layers=2, n_heads=3, causal=False,
                 attn_implementation="eager", versions={"torch": "2.x"})


def random_map(tokens, layers=2, heads=3, seed=0, example_id=""):
    gen = torch.Generator().manual_seed(seed)
    n = len(tokens)
    pattern = torch.softmax(torch.randn(layers, heads, n, n, generator=gen) * 3, dim=-1)
    info = ModelInfo(name="tiny", arch="BertModel", n_layers=layers, n_heads=heads,
                     causal=False, attn_implementation="eager", versions={"torch": "2.x"})
    return AttentionMap(pattern=pattern, query_tokens=tokens, key_tokens=tokens,
                        layers=tuple(range(layers)), info=info, example_id=example_id)


def classified(layers=2, heads=3):
    rows = []
    for layer in range(layers):
        for head in range(heads):
            prev = {0: 0.9, 1: 0.1}.get(head, 0.05)
            rows.append({"stack": "encoder", "kind": "self", "layer": layer, "head": head,
                         "head_id": f"L{layer}H{head}", "prev": prev, "self": 0.1,
                         "next": 0.1, "entropy_norm": 0.5 + 0.1 * head, "max_weight": 0.4,
                         "prev_nosink": prev, "sink": 0.7 if head == 2 else 0.0})
    return classify_scores(pd.DataFrame(rows))


def script_tags(html):
    return re.findall(r"<script\b[^>]*>", html, flags=re.IGNORECASE)


# ---- escaping ---------------------------------------------------------------------------------

def test_evil_token_only_appears_escaped():
    amap = random_map(["[CLS]", EVIL, "&amp;", "\u2028x", "</script >", "[SEP]"],
                      example_id=EVIL)
    syntax = pd.DataFrame({"relation": [EVIL], "accuracy": [0.5]})
    html = build(maps=[amap], census=classified(), syntax=syntax, title=EVIL).html
    assert EVIL not in html
    assert "alert(1)" in html  # present, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # exactly the script elements we wrote: one JSON data block and one program
    assert script_tags(html) == ['<script type="application/json" id="ap-maps">', "<script>"]
    assert html.lower().count("</script") == 2
    start = html.index('id="ap-maps">')
    block = html[start:html.index("</script>", start)]
    assert not set(block) & {"<", "\u2028", "\u2029"}  # U+2028 is fine in HTML text
    packed = data.read_script_json(html, "ap-maps")
    assert packed[0]["query_tokens"][1] == EVIL
    assert packed[0]["query_tokens"][3] == "\u2028x"


def test_escape_json_has_no_markup_characters():
    text = data.escape_json({"t": EVIL + "&\u2029"})
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert "\\u003cscript\\u003e" in text


def test_no_urls_or_external_references():
    html = build(maps=[random_map(list("abcd"))], census=classified(),
                 perturbation=pd.DataFrame({"x": [1.0]})).html
    assert not re.search(r"https?:", html, flags=re.IGNORECASE)
    assert not re.search(r"//[a-z0-9.-]+\.[a-z]{2,}", html, flags=re.IGNORECASE)
    for attr in re.findall(r"\b(?:src|href|xlink:href|action)\s*=\s*[\"']?([^\"'\s>]*)", html,
                           flags=re.IGNORECASE):
        assert attr.startswith(("data:", "#")), attr
    assert "@import" not in html and "url(" not in html


# ---- data ----------------------------------------------------------------------------------------

def test_embedded_weights_decode_within_half_a_step():
    amap = random_map(["a", "b", "c", "d", "e"], layers=2, heads=3, seed=3)
    html = build(maps=[amap]).html
    packed = data.read_script_json(html, "ap-maps")[0]
    decoded = data.unpack_weights(packed)
    assert decoded.shape == tuple(amap.pattern.shape)
    err = np.abs(decoded - amap.pattern.numpy()).max()
    assert err <= data.MAX_ERROR + 1e-7
    assert packed["layers"] == [0, 1] and packed["heads"] == [0, 1, 2]


def test_quantise_extremes():
    q = data.quantise(np.array([0.0, 1.0, 0.5, 1 / 510 - 1e-9]))
    assert q.tolist() == [0, 255, 128, 0]


def test_122_token_map_of_72_heads_is_under_2mb(tmp_path):
    tokens = ["[CLS]", *(f"tok{i}" for i in range(120)), "[SEP]"]
    amap = random_map(tokens, layers=6, heads=12, seed=1)
    report = build(maps=[amap], census=classified(6, 12))
    assert report.size_bytes <= 2_000_000
    path = report.save(tmp_path / "out" / "r.html")
    assert path.stat().st_size == report.size_bytes


# ---- sections ---------------------------------------------------------------------------------

def sections(html):
    return set(re.findall(r'<section id="sec-([a-z]+)">', html))


def test_sections_follow_inputs():
    assert sections(build(info=INFO).html) == {"model"}
    assert sections(build(maps=random_map(list("ab"))).html) == {"model", "attention"}
    comparison = pd.DataFrame({"source": ["rollout@L1"], "metric": ["spearman"], "mean": [0.3]})
    html = build(census=classified(), syntax=pd.DataFrame({"relation": ["nsubj"]}),
                 comparison=comparison, perturbation=pd.DataFrame({"delta": [0.1]}),
                 info=INFO).html
    assert sections(html) == {"model", "heads", "profile", "syntax", "comparison",
                              "perturbation"}
    assert "<script" not in html  # no maps: no data and no program


def test_nothing_to_report_is_an_error():
    from attnprobe.errors import InputError
    with pytest.raises(InputError, match="nothing to report"):
        build()


def test_model_card():
    html = build(maps=[random_map(["hello", "world"], example_id="s1")]).html
    for text in ("tiny", "BertModel", "2 × 3", "bidirectional", "eager", "torch 2.x",
                 "<bdi>s1</bdi>: <bdi>hello</bdi> <bdi>world</bdi>", "1 sentence(s)"):
        assert text in html, text


# ---- figures ----------------------------------------------------------------------------------

def test_head_grid_has_one_cell_per_head_with_label_tooltip():
    table = classified(2, 3)
    grid = svg.head_grid(table)
    cells = re.findall(r'<g class="head-cell" data-head="(L\d+H\d+)">.*?<title>(.*?)</title>',
                       grid, flags=re.S)
    assert sorted(h for h, _ in cells) == sorted(table["head_id"])
    labels = dict(zip(table["head_id"], table["label"], strict=True))
    for head, tip in cells:
        assert tip.startswith(f"{head}: {labels[head]}")
        assert "prev=" in tip
    assert svg.colour(labels["L0H0"]) in grid


def test_head_grid_legend_and_label_table_group_labels_by_family():
    table = classified(2, 3)  # per layer: head 0 previous, head 1 heterogeneous, head 2 sink
    assert list(table["label"]) == ["previous", "heterogeneous", "sink"] * 2
    grid = svg.head_grid(table)
    texts = re.findall(r'<text[^>]*?( font-weight="bold")?>([^<]*)</text>', grid)
    legend = [(bool(bold), text) for bold, text in texts if "(" in text]
    assert legend == [(True, "local (2)"), (False, "previous (2)"), (True, "sink (2)"),
                      (False, "sink (2)"), (True, "heterogeneous (2)"),
                      (False, "heterogeneous (2)")]
    html = build(census=table, info=INFO).html
    start = html.index('<section id="sec-heads">')
    section = html[start:html.index("</section>", start)]
    rows = re.findall(r"<tr>(.*?)</tr>", section, flags=re.S)
    cells = [found for row in rows if (found := re.findall(r"<td>(.*?)</td>", row))]
    assert cells == [["local", "2", "previous", "2", "0.3333", "0,1", "L0H0, L1H0"],
                     ["sink", "2", "sink", "2", "0.3333", "0,1", "L0H2, L1H2"],
                     ["heterogeneous", "2", "heterogeneous", "2", "0.3333", "0,1",
                      "L0H1, L1H1"]]


def test_palette_covers_every_label():
    palette = svg.palette()
    assert tuple(palette) == PRECEDENCE
    assert len(set(palette.values())) == len(PRECEDENCE)
    assert svg.UNKNOWN_COLOUR not in palette.values()
    assert svg.colour("no such label") == svg.UNKNOWN_COLOUR


def test_layer_profile_and_mds_escape_text():
    table = classified(2, 3)
    chart = svg.layer_profile_chart(layer_profile(table))
    assert chart.count("<rect") >= 2 and "L1" in chart
    clusters = pd.DataFrame({"head_id": [EVIL, "L0H1"], "stack": ["e", "e"],
                             "kind": ["self", "self"], "layer": [0, 0], "head": [0, 1],
                             "cluster": [0, 1], "x": [0.0, 1.0], "y": [0.0, 0.5]})
    scatter = svg.mds_scatter(clusters)
    assert EVIL not in scatter and scatter.count("<circle") == 2


def test_census_object_with_distances_gets_clusters():
    class Part:
        distances = object()

    class FakeCensus:
        sums = Part()  # the census's summed statistics (``Census.sums``)

        def classify(self):
            return classified(2, 2)

        def clusters(self):
            return pd.DataFrame({"head_id": ["L0H0", "L0H1", "L1H0", "L1H1"],
                                 "stack": ["encoder"] * 4, "kind": ["self"] * 4,
                                 "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                                 "cluster": [0, 0, 1, 1], "x": [0.0, 0.1, 1.0, 1.1],
                                 "y": [0.0, 0.2, 0.9, 1.0]})

    html = build(census=FakeCensus(), info=INFO).html
    assert {"heads", "profile", "clusters"} <= sections(html)


def test_import_attnprobe_does_not_import_report():
    import subprocess
    import sys
    code = ("import sys, attnprobe; "
            "assert 'attnprobe.report' not in sys.modules; "
            "assert 'jinja2' not in sys.modules and 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
