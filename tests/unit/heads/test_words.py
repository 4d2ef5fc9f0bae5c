import pytest
import torch

from attnprobe import InputError
from attnprobe.heads.words import align_tokens, normalise, to_words

# 4 tokens, 3 words: token 0 -> word 0, tokens 1-2 -> word 1, token 3 -> word 2
A = torch.tensor([[0.10, 0.20, 0.30, 0.40],
                  [0.40, 0.30, 0.20, 0.10],
                  [0.25, 0.25, 0.25, 0.25],
                  [0.00, 0.50, 0.50, 0.00]], dtype=torch.float64)
TW = torch.tensor([0, 1, 1, 2])


def test_hand_computed_sum_to_and_every_from():
    # to = sum over pieces: columns [t0, t1 + t2, t3]
    # rows of word 1 are tokens 1, 2: [.4, .5, .1] and [.25, .5, .25]
    first_row, last_row = [0.10, 0.50, 0.40], [0.00, 1.00, 0.00]
    expected = {
        "mean": [first_row, [0.325, 0.50, 0.175], last_row],
        "first": [first_row, [0.40, 0.50, 0.10], last_row],
        "max": [first_row, [0.40, 0.50, 0.25], last_row],
    }
    for from_agg, rows in expected.items():
        got = to_words(A, TW, 3, from_agg=from_agg)
        assert torch.allclose(got, torch.tensor(rows, dtype=torch.float64)), from_agg


def test_hand_computed_mean_and_max_to():
    # to = max over pieces: word-1 column is max(t1, t2) per row = [.3, .3, .25, .5]
    got = to_words(A, TW, 3, to_agg="max", from_agg="first")
    assert torch.allclose(got, torch.tensor([[0.10, 0.30, 0.40], [0.40, 0.30, 0.10],
                                             [0.00, 0.50, 0.00]], dtype=torch.float64))
    # to = mean over pieces: word-1 column is (t1 + t2) / 2 = [.25, .25, .25, .5]
    got = to_words(A, TW, 3, to_agg="mean", from_agg="first")
    assert torch.allclose(got, torch.tensor([[0.10, 0.25, 0.40], [0.40, 0.25, 0.10],
                                             [0.00, 0.50, 0.00]], dtype=torch.float64))


@pytest.mark.parametrize("from_agg", ["mean", "first"])
def test_rows_still_sum_to_one_when_no_token_is_dropped(from_agg):
    pattern = torch.softmax(torch.randn(2, 3, 7, 7), dim=-1)  # [layer, head, q, k]
    token_word = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    words = to_words(pattern, token_word, 4, from_agg=from_agg)
    assert words.shape == (2, 3, 4, 4)
    assert torch.allclose(words.sum(-1), torch.ones(2, 3, 4))


def test_dropped_tokens_are_left_out():
    token_word = torch.tensor([-1, 0, 1, 1, 2, -1])  # [CLS] ... [SEP]
    pattern = torch.softmax(torch.randn(6, 6), dim=-1)
    words = to_words(pattern, token_word, 3)
    inner = pattern[1:5, 1:5]
    assert torch.allclose(words, to_words(inner, torch.tensor([0, 1, 1, 2]), 3))
    assert (words.sum(-1) < 1).all()


def test_batched_equals_per_example_with_padding():
    examples = [(torch.tensor([-1, 0, 1, 1, 2, -1]), 3), (torch.tensor([-1, 0, 0, 1, -1]), 2)]
    n_tokens, n_words = 7, 3
    batch = torch.zeros(2, 2, 4, n_tokens, n_tokens)  # [batch, layer, head, q, k]
    token_word = torch.full((2, n_tokens), -1)
    singles = []
    for b, (tw, n) in enumerate(examples):
        t = len(tw)
        pattern = torch.softmax(torch.randn(2, 4, t, t), dim=-1)
        batch[b, :, :, :t, :t] = pattern
        batch[b, :, :, t:, :] = 0.25  # padding rows hold junk; padding tokens are -1
        token_word[b, :t] = tw
        singles.append(to_words(pattern, tw, n, from_agg="max", to_agg="max"))
    got = to_words(batch, token_word, n_words, from_agg="max", to_agg="max")
    assert got.shape == (2, 2, 4, n_words, n_words)
    assert torch.allclose(got[0], singles[0])
    assert torch.allclose(got[1, :, :, :2, :2], singles[1])
    assert (got[1, :, :, 2] == 0).all() and (got[1, :, :, :, 2] == 0).all()
    for from_agg in ("mean", "first"):
        got = to_words(batch, token_word, n_words, from_agg=from_agg)
        for b, (tw, n) in enumerate(examples):
            t = len(tw)
            single = to_words(batch[b, :, :, :t, :t], tw, n, from_agg=from_agg)
            assert torch.allclose(got[b, :, :, :n, :n], single)


def test_input_is_not_changed():
    pattern = torch.softmax(torch.randn(3, 4, 4), dim=-1)
    before = pattern.clone()
    to_words(pattern, TW, 3, from_agg="max", to_agg="max")
    assert torch.equal(pattern, before)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"to_agg": "avg"}, r"unknown to_agg 'avg'; choose one of 'sum', 'mean', 'max'"),
    ({"from_agg": "last"}, r"unknown from_agg 'last'; choose one of 'mean', 'first', 'max'"),
    ({"n_words": 2}, r"token_word values must lie in -1..1"),
    ({"token_word": torch.tensor([0, 1, 2])}, "does not match"),
    ({"token_word": torch.tensor([0.0, 1, 1, 2])}, "integer tensor"),
])
def test_bad_arguments(kwargs, match):
    args = {"pattern": A, "token_word": TW, "n_words": 3} | kwargs
    with pytest.raises(InputError, match=match):
        to_words(**args)


# ----------------------------------------------------------------------------- align_tokens
def test_align_wordpiece():
    tokens = ["[CLS]", "the", "cat", "isn", "'", "t", "here", "[SEP]"]
    assert align_tokens(tokens, ["The", "cat", "isn't", "here"]) == [-1, 0, 1, 2, 2, 2, 3, -1]


def test_align_wordpiece_continuations_and_accents():
    tokens = ["[CLS]", "na", "##ive", "cafe", "-", "goers", "[SEP]", "[PAD]"]
    assert align_tokens(tokens, ["Naïve", "café-goers"]) == [-1, 0, 0, 1, 1, 1, -1, -1]


def test_align_gpt2_byte_level_tokens():
    # GPT-2 writes a leading space as 'Ġ' and UTF-8 bytes as printable characters: 'Ã©' = é
    tokens = ["The", "Ġcat", "Ġcaf", "Ã©", "Ġisn", "'t", "Ġhere", "."]
    words = ["The", "cat", "café", "isn't", "here", "."]
    assert align_tokens(tokens, words) == [0, 1, 2, 2, 3, 3, 4, 5]


def test_align_roberta_and_sentencepiece():
    roberta = ["<s>", "The", "Ġcat", "Ġsat", ".", "</s>"]
    assert align_tokens(roberta, ["The", "cat", "sat", "."]) == [-1, 0, 1, 2, 3, -1]
    pieces = ["▁The", "▁ca", "t", "▁", ".", "</s>"]  # a bare '▁' goes with the next word
    assert align_tokens(pieces, ["The", "cat", "."]) == [0, 1, 1, 2, 2, -1]


def test_unknown_token_consumes_the_rest_of_a_word():
    tokens = ["[CLS]", "the", "[UNK]", "sat", "[SEP]"]
    assert align_tokens(tokens, ["The", "☃cat", "sat"]) == [-1, 0, 1, 2, -1]
    assert align_tokens(["the", "ca", "[UNK]", "sat"], ["the", "ca☃", "sat"]) == [0, 1, 1, 2]


def test_a_token_may_run_into_a_word_that_still_gets_its_own_token():
    # spaCy splits "isn't" into 'is' + "n't"; WordPiece gives 'isn' + "'" + 't'
    tokens = ["[CLS]", "the", "cat", "isn", "'", "t", "here", "[SEP]"]
    words = ["The", "cat", "is", "n't", "here"]
    assert align_tokens(tokens, words) == [-1, 0, 1, 2, 3, 3, 4, -1]


def test_mismatch_names_sentence_and_word():
    with pytest.raises(InputError, match=r"sentence s9: tokens \['the', 'dog'\] do not match "
                                         r"word 1 'cat'"):
        align_tokens(["the", "dog"], ["The", "cat"], sentence_id="s9")


@pytest.mark.parametrize(("tokens", "words", "match"), [
    (["the", "cat", "sat"], ["the", "cat"], "left over after the last word 'cat'"),
    (["the", "ca"], ["the", "cat"], "tokens end before word 1 'cat'"),
    (["the"], ["the", "cat"], "tokens end before word 1 'cat'"),
    (["cannot"], ["can", "not"], "word 1 'not' gets no token of its own"),
    (["the"], [], "no words"),
])
def test_alignment_errors(tokens, words, match):
    with pytest.raises(InputError, match=match):
        align_tokens(tokens, words, sentence_id="x")


def test_normalise():
    assert normalise("Ça  Va\u200b") == "cava"
    assert normalise("İstanbul") == "istanbul"
