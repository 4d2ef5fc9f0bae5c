"""Every corpus analysis takes the same signature: ``(model, tokenizer, texts, *, scope,
batch_size, truncation, seed, progress)`` with the same names and defaults (issue: one
signature for corpus analyses), and ``distributed``."""

import inspect

import pytest

import attnprobe as ap

SHARED = ("scope", "batch_size", "truncation", "seed", "progress", "distributed")
DEFAULTS = {"scope": "all", "batch_size": 16, "truncation": "error", "seed": 0,
            "progress": False, "distributed": None}


@pytest.mark.parametrize("fn", [ap.extract, ap.head_stats, ap.heads.census,
                                ap.attribution.compare, ap.perturb.run,
                                ap.heads.retrieval_scores],
                         ids=lambda fn: fn.__name__)
def test_corpus_analyses_share_names_kinds_and_defaults(fn):
    params = inspect.signature(fn).parameters
    assert list(params)[:3] == ["model", "tokenizer", "texts"]
    for name in SHARED:
        assert name in params, name
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == DEFAULTS[name], name
