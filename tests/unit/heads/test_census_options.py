"""The census's shared corpus options: scope, truncation and seed, on tiny BERT."""

from __future__ import annotations

import pandas as pd
import pytest

from attnprobe.errors import InputError
from attnprobe.heads import CensusOptions, census
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

TEXTS = ["the cat sat on a mat", "a big dog ran", "the red cat ran on the mat",
         "a dog sat"]
# enough ordinary tokens for the default repeated-token probe (2 x 32 draws)
WORDS = ("the cat sat on a mat dog ran big red " + " ".join(f"w{i}" for i in range(40)))
SCORES = ["entropy", "max_weight", "prev", "self", "next", "first", "special", "distance"]


@pytest.fixture(scope="module")
def bert():
    vocab = bert_vocab(WORDS)
    return tiny_bert(vocab), bert_tokenizer(vocab)


def _scores(result) -> pd.DataFrame:
    return result.scores().set_index(["layer", "head"]).sort_index()


def test_a_scope_scores_exactly_its_heads_with_the_full_census_values(bert):
    model, tok = bert
    full = _scores(census(model, tok, TEXTS, batch_size=2, similarity=False, repeated=False))
    for spec, heads in [("heads:0.1,1.0", [(0, 1), (1, 0)]), ("layer:1", [(1, 0), (1, 1)]),
                        ("*.0", [(0, 0), (1, 0)])]:
        part = _scores(census(model, tok, TEXTS, scope=spec, batch_size=2, similarity=False,
                              repeated=False))
        assert list(part.index) == heads
        pd.testing.assert_frame_equal(part[SCORES], full.loc[heads, SCORES], atol=1e-6,
                                      check_exact=False)


def test_the_probe_follows_the_scope(bert):
    model, tok = bert
    result = census(model, tok, TEXTS, scope="head:1.1", similarity=False)
    assert list(zip(result.scores()["layer"], result.scores()["head"], strict=True)) == [(1, 1)]
    assert result.scores()["rep_prev"].notna().all()


def test_truncation_skip_and_cut(bert):
    model, tok = bert  # 64 positions
    long = " ".join(["cat"] * 80)
    with pytest.raises(InputError, match="sentence 1 has 82 tokens"):
        census(model, tok, [TEXTS[0], long], repeated=False, similarity=False)
    skipped = census(model, tok, [TEXTS[0], long], truncation="skip", repeated=False,
                     similarity=False)
    assert skipped.skipped == ("1",) and skipped.n_sentences == 1
    cut = census(model, tok, [TEXTS[0], long], truncation="cut", repeated=False,
                 similarity=False)
    assert cut.skipped == () and cut.n_sentences == 2
    assert cut.tally.counts[("encoder.layer", "self", 0)] == 8 + 64  # every row of both


def test_seed_draws_the_probe_and_nothing_else(bert):
    model, tok = bert
    one = census(model, tok, TEXTS, seed=0, similarity=False).scores()
    same = census(model, tok, TEXTS, seed=0, similarity=False).scores()
    other = census(model, tok, TEXTS, seed=1, similarity=False).scores()
    pd.testing.assert_frame_equal(one, same)
    pd.testing.assert_frame_equal(one[SCORES], other[SCORES])  # the corpus does not move
    assert not one["rep_prev"].equals(other["rep_prev"])


@pytest.mark.parametrize("kwargs, message", [
    ({"similarity_rows": 0}, "similarity_rows must be a positive integer"),
    ({"similarity_rows": -1}, "similarity_rows must be a positive integer"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"truncation": "drop"}, "unknown truncation 'drop'"),
    ({"scope": "layer:7"}, r"layers \[7\] out of range"),
])
def test_bad_options_are_one_line_errors(bert, kwargs, message):
    model, tok = bert
    with pytest.raises(InputError, match=message):
        census(model, tok, TEXTS, **kwargs)


def test_a_sentence_pair_with_an_empty_half_is_refused(bert):
    model, tok = bert
    with pytest.raises(InputError, match=r"text 1 is a sentence pair .* with an empty half"):
        census(model, tok, [TEXTS[0], "the cat\t  "], repeated=False)


def test_the_options_object_and_the_keywords_give_the_same_census(bert):
    model, tok = bert
    options = CensusOptions(similarity_rows=4, repeated=False, max_offset=2, window=2)
    by_object = census(model, tok, TEXTS, options=options)
    by_keywords = census(model, tok, TEXTS, similarity_rows=4, repeated=False, max_offset=2,
                         window=2)
    pd.testing.assert_frame_equal(by_object.scores(), by_keywords.scores())
    pd.testing.assert_frame_equal(by_object.distances(), by_keywords.distances())
    both = census(model, tok, TEXTS, options=options, similarity=False)  # keywords replace
    assert both.sums.distances is None and "offset-2" in both.scores()
    with pytest.raises(InputError, match=r"unknown option.*simlarity"):
        census(model, tok, TEXTS, simlarity=False)
    with pytest.raises(InputError, match="probe_length needs the repeated-token probe"):
        CensusOptions(repeated=False, probe_length=4)
