"""The report's causal sections (issue 18 §6): direct logit attribution and composition for
pre-norm language models, patching with corrupted inputs — the numbers the page shows are
those of ``ap.heads.logit_attribution``, ``ap.heads.composition`` and ``ap.patch.heads`` run
on their own; post-norm MiniLM gets none of them; bad patching requests are refused before
any forward."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.heads import composition, logit_attribution
from attnprobe.patch import summary
from attnprobe.report import SECTIONS, from_model
from attnprobe.report import pipeline as pipeline_module

TEXTS = ["t01 t02 t03 t04 t01 t02 t03", "t05 t06 t07 t05 t06 t07 t05", "t08 t09 t08 t09"]
CORRUPT = ["t11 t12 t13 t14 t01 t02 t03", "t15 t16 t17 t18 t06 t07 t05", "t18 t19 t08 t09"]
CAUSAL = ("sec-logit-attribution", "sec-composition", "sec-patching")
EXISTING = ("model", "census", "attention", "syntax", "comparison", "perturbation", "diff",
            "tables")


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


@pytest.fixture(scope="module")
def page(induction):
    """Every causal section on the first two texts (``causal_texts=2``)."""
    model, tok = induction
    return from_model(model, tok, TEXTS, view_texts=1, causal_texts=2, corrupt=CORRUPT,
                      metric_positions="all")


def section(page_html: str, name: str) -> str:
    start = page_html.index(f'<section id="sec-{name}"')
    return page_html[start:page_html.index("</section>", start)]


def tips(markup: str) -> list[str]:
    """The tooltips of a section's figure cells, unescaped."""
    return [html.unescape(t) for t in re.findall(r"<title>(.*?)</title>", markup, re.S)]


def four_digits(value: float) -> float:
    return float(f"{value:.4g}")


def test_sections_come_after_the_existing_ones_and_only_when_given():
    ranks = {kind.name: kind.rank for kind in SECTIONS.values()}
    assert min(ranks[n] for n in ("logit-attribution", "composition", "patching")) > \
        max(ranks[n] for n in EXISTING)
    assert ranks["logit-attribution"] < ranks["composition"] < ranks["patching"]


def test_the_page_shows_the_direct_logit_attribution_of_the_first_texts(page, induction):
    model, tok = induction
    ids = re.findall(r'<section id="([^"]+)"', page.html)
    assert [s for s in ids if s in CAUSAL] == list(CAUSAL)  # in rank order, at the end
    assert ids[-3:] == list(CAUSAL)
    alone = logit_attribution(model, tok, TEXTS[:2], "logit:next", metric_positions="all")
    assert page.contents.logit_attribution.table.equals(alone.table)
    body = section(page.html, "logit-attribution")
    assert "2 example(s) (the first 2 of 3)" in body
    # one cell per head, its value the head's mean direct part as logit_attribution gives it
    by_head = alone.by_head()
    shown = {}
    for tip in tips(body):
        found = re.fullmatch(r"L(\d)H(\d): (\S+) of logit:next \(mean per example\)", tip)
        if found:
            shown[int(found[1]), int(found[2])] = float(found[3])
    assert sorted(shown) == [(la, h) for la in range(2) for h in range(4)]
    for (layer, head), value in shown.items():
        assert value == four_digits(by_head.loc[layer, head])
    # the heads sum to what logit_attribution gives (4 digits per cell)
    assert sum(shown.values()) == pytest.approx(float(np.nansum(by_head.to_numpy())),
                                                rel=1e-3, abs=1e-3)
    # the top heads, largest |mean direct part| first
    first = by_head.stack().abs().sort_values(ascending=False).index[0]
    listed = body[body.index("heads with the largest"):body.index("mean per component")]
    top = re.findall(r"<tr><td>(L\dH\d)</td>", listed)
    assert top[0] == f"L{first[0]}H{first[1]}" and len(top) == 8


def test_the_page_shows_composition_over_the_baseline(page, induction):
    model, _ = induction
    alone = composition(model)
    assert page.contents.composition.table.equals(alone.table)
    body = section(page.html, "composition")
    cells = [t for t in tips(body) if "-composition" in t]
    assert len(cells) == len(alone.table)  # 3 kinds × 4 writers × 4 readers
    table = alone.table.assign(ratio=alone.table["score"] / alone.table["baseline"])
    for tip in cells:
        found = re.fullmatch(r"L0H(\d) → L1H(\d): ([qkv])-composition (\S+) \((\S+) × "
                             r"baseline (\S+)\)", tip)
        assert found, tip
        row = table[(table["kind"] == found[3]) & (table["writer_head"] == int(found[1]))
                    & (table["reader_head"] == int(found[2]))].iloc[0]
        assert (float(found[4]), float(found[5])) == (four_digits(row["score"]),
                                                      four_digits(row["ratio"]))
    # the strongest pair first
    best = table.loc[table["ratio"].idxmax()]
    strongest = re.search(r"<tr><td>([qkv])</td><td>(L\dH\d)</td><td>(L\dH\d)</td>", body)
    assert strongest.groups() == (best["kind"], f"L0H{best['writer_head']}",
                                  f"L1H{best['reader_head']}")


def test_the_page_shows_head_patching_of_the_first_pairs(page, induction):
    model, tok = induction
    alone = ap.patch.heads(model, tok, TEXTS[:2], CORRUPT[:2], "logit:next",
                           metric_positions="all")
    assert page.contents.patching.equals(alone)
    body = section(page.html, "patching")
    means = summary(alone).set_index(["layer", "head"])["effect"]
    shown = {}
    for tip in tips(body):
        found = re.match(r"L(\d)H(\d): effect (\S+) ", tip)
        if found:
            shown[int(found[1]), int(found[2])] = float(found[3])
    assert shown == {key: four_digits(value) for key, value in means.items()}
    assert "2 example pair(s) (the first 2 of 3 texts" in body


def test_options_leave_sections_out(induction):
    model, tok = induction
    page = from_model(model, tok, TEXTS[:1], logit_attribution=False, composition=False)
    assert not any(f'id="{s}"' in page.html for s in CAUSAL)
    path = from_model(model, tok, TEXTS[:2], corrupt=CORRUPT[:2], logit_attribution=False,
                      composition=False, patch="path",
                      patch_options={"receivers": "layer:1", "into": "k"},
                      metric_positions="all", scope="layer:0")  # path takes no scope
    assert [s for s in CAUSAL if f'id="{s}"' in path.html] == ["sec-patching"]
    table = path.contents.patching
    assert set(table["experiment"]) == {"path"} and set(table["into"]) == {"k"}
    assert set(table["sender_layer"]) == {0}


@pytest.fixture(scope="module")
def minilm():
    return ap.load_model("minilm")


def test_post_norm_minilm_gets_no_causal_section(minilm):
    model, tok = minilm
    texts = ["The cat sat on the mat.", "A dog barked."]
    page = from_model(model, tok, texts, view_texts=1, scope="layer:0")
    assert not any(f'id="{s}"' in page.html for s in CAUSAL)
    contents = page.contents
    assert contents.logit_attribution is None and contents.composition is None
    # nothing was computed: the page is the one built without the causal steps
    none = from_model(model, tok, texts, view_texts=1, scope="layer:0",
                      logit_attribution=False, composition=False)
    assert none.html == page.html


def _refused(model, tok, monkeypatch, texts, **options):
    """The InputError of ``from_model``, asserting no forward (census or other) ran."""
    forwards = []

    def no_census(*args, **kwargs):
        raise AssertionError("the census ran before the request was checked")

    monkeypatch.setattr(pipeline_module, "census", no_census)
    handle = model.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        with pytest.raises(InputError) as err:
            from_model(model, tok, texts, **options)
    finally:
        handle.remove()
    assert not forwards and "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"corrupt": CORRUPT[:2]}, "2 corrupted input(s) for 3 text(s)"),
    ({"corrupt": [CORRUPT[0], "t11 t12", CORRUPT[2]]}, "input 1 tokenize to 8 and 3 tokens"),
    ({"corrupt": CORRUPT, "patch": "bogus"}, "patching experiment 'bogus'"),
    ({"corrupt": CORRUPT, "patch_options": {"site": "x"}}, "site"),
    ({"corrupt": CORRUPT, "patch_options": {"receivers": "layer:1"}}, "receivers"),
    ({"corrupt": CORRUPT, "patch": "path"}, "path patching needs receivers"),
    ({"corrupt": CORRUPT, "metric": "logit:nosuchtoken"}, "nosuchtoken"),
    ({"causal_texts": 0}, "causal_texts"),
])
def test_bad_patching_requests_are_refused_before_any_forward(induction, monkeypatch,
                                                               options, message):
    model, tok = induction
    assert message in _refused(model, tok, monkeypatch, TEXTS, **options)


def test_post_norm_and_headless_models_are_refused_before_any_forward(minilm, monkeypatch):
    model, tok = minilm
    texts, corrupt = ["The cat sat on the mat."], ["The dog sat on the mat."]
    path = _refused(model, tok, monkeypatch, texts, corrupt=corrupt, patch="path",
                    patch_options={"receivers": "layer:1"}, metric=lambda out, batch: out[0])
    assert "pre-norm residual stream" in path and "post-norm" in path
    assert "no output head" in _refused(model, tok, monkeypatch, texts, corrupt=corrupt)


def test_a_large_composition_matrix_keeps_the_strongest_heads(page, monkeypatch):
    from attnprobe.report import circuit_views
    from attnprobe.report.svg_figures import composition as composition_svg

    found = page.contents.composition
    monkeypatch.setattr(composition_svg, "MATRIX_HEADS", 2)
    body = str(circuit_views.composition_body(found))
    for kind in found.kinds:
        ratio = found.matrix(kind, "ratio")
        writers = set(ratio.max(axis=1).nlargest(2).index)
        cells = [t for t in tips(body) if f": {kind}-composition" in t]
        assert {t.split(" → ")[0] for t in cells} == writers and len(cells) == 4
    assert "the 2 writers × 2 readers of the strongest pairs" in html.unescape(body)


def test_a_decomposition_the_model_does_not_match_names_the_way_out(induction, monkeypatch):
    from attnprobe.report import causal
    from attnprobe.weights.anatomy import DecompositionError

    def broken(*args, **kwargs):
        raise DecompositionError("example 0: the components sum to 1 but the logit is 2")

    monkeypatch.setattr(causal, "logit_attribution", broken)
    model, tok = induction
    with pytest.raises(DecompositionError, match="--no-logit-attribution"):
        from_model(model, tok, TEXTS[:1])
