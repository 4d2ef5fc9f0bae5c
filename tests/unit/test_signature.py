"""Every corpus analysis takes the same signature: ``(model, tokenizer, texts, <its own
options>, *, corpus: CorpusOptions | None = None, **keywords)`` (issue 25: one CorpusOptions),
where ``keywords`` are the corpus fields by name for the calls written before, and no more
than 10 parameters."""

import inspect

import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.core.corpus_options import CORPUS_FIELDS, CorpusOptions
from attnprobe.errors import InputError

# the defaults the corpus keywords had when each analysis listed them
DEFAULTS = {"scope": "all", "truncation": "error", "seed": 0, "progress": False,
            "distributed": None, "max_length": None}

CORPUS_ANALYSES = [ap.extract, ap.head_stats, ap.heads.census, ap.attribution.compare,
                   ap.perturb.run, ap.heads.retrieval_scores, ap.heads.logit_attribution,
                   ap.heads.diff, ap.heads.attention_change, ap.attribution.attribute,
                   ap.report.from_model]


@pytest.mark.parametrize("fn", CORPUS_ANALYSES, ids=lambda fn: fn.__name__)
def test_corpus_analyses_take_one_corpus_options(fn):
    params = inspect.signature(fn).parameters
    assert list(params)[:2] in (["model", "tokenizer"], ["model_a", "model_b"])
    assert params["corpus"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["corpus"].default is None
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert not set(params) & set(CORPUS_FIELDS), "a corpus field re-listed by hand"
    named = [p for p in params.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert len(named) <= 10


def test_the_corpus_defaults_are_the_old_keyword_defaults():
    defaults = CorpusOptions()
    for name, value in DEFAULTS.items():
        assert getattr(defaults, name) == value, name
    assert defaults.batch() == 16  # DEFAULT_BATCH_SIZE, unless an analysis has its own


@pytest.fixture(scope="module")
def bert():
    from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

    vocab = bert_vocab()
    return tiny_bert(vocab).eval(), bert_tokenizer(vocab)


CALLS = {
    "extract": lambda m, t, **kw: ap.extract(m, t, ["the cat"], **kw),
    "head_stats": lambda m, t, **kw: ap.head_stats(m, t, ["the cat"], **kw),
    "census": lambda m, t, **kw: ap.heads.census(m, t, ["the cat"], **kw),
    "compare": lambda m, t, **kw: ap.attribution.compare(m, t, ["the cat"], "class:0", **kw),
    "attribute": lambda m, t, **kw: ap.attribution.attribute(m, t, ["the cat"], "class:0",
                                                             **kw),
    "retrieval_scores": lambda m, t, **kw: ap.heads.retrieval_scores(m, t, ["the cat"], **kw),
    "logit_attribution": lambda m, t, **kw: ap.heads.logit_attribution(
        m, t, ["the cat"], "logit:next", **kw),
    "diff": lambda m, t, **kw: ap.heads.diff(m, m, t, ["the cat"], **kw),
    "attention_change": lambda m, t, **kw: ap.heads.attention_change(m, m, t, ["the cat"],
                                                                      **kw),
    "from_model": lambda m, t, **kw: ap.report.from_model(m, t, ["the cat"], **kw),
    "build": lambda m, t, **kw: ap.report.build(**kw),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_unknown_keyword_is_a_one_line_error_naming_it(bert, name):
    model, tok = bert
    with pytest.raises(InputError, match="no_such_option") as err:
        CALLS[name](model, tok, no_such_option=1)
    assert "\n" not in str(err.value)


def _table(result) -> pd.DataFrame:
    if isinstance(result, list):  # maps
        return pd.concat([m.to_frame() for m in result], ignore_index=True)
    return result.scores() if hasattr(result, "scores") else result.to_frame()


@pytest.mark.parametrize("name", ["extract", "head_stats", "census", "attention_change"])
def test_the_corpus_keywords_and_the_corpus_object_give_the_same_result(bert, name):
    model, tok = bert
    by_name = CALLS[name](model, tok, scope="layer:1", batch_size=1, max_length=8,
                          truncation="cut")
    by_object = CALLS[name](model, tok, corpus=CorpusOptions(
        scope="layer:1", batch_size=1, max_length=8, truncation="cut"))
    pd.testing.assert_frame_equal(_table(by_name), _table(by_object))
    with pytest.raises(InputError, match="batch_size must be a positive integer"):
        CALLS[name](model, tok, batch_size=0)
