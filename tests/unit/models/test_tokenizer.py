"""WordTokenizer: exact tokens and ids, both padding sides, and input errors."""

from __future__ import annotations

import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.models import WordTokenizer


@pytest.fixture(scope="module")
def tok() -> WordTokenizer:
    return WordTokenizer()


def test_specials_and_defaults(tok):
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id) == (0, 1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["[PAD]", "[UNK]", "[BOS]"]
    assert tok.model_max_length == 64
    assert 200 < len(tok) == tok.vocab_size < 1000
    assert WordTokenizer().get_vocab() == tok.get_vocab()  # deterministic


def test_tokenize_lowercases_and_splits_punctuation(tok):
    assert tok.tokenize("The cat sat on the mat.") == ["the", "cat", "sat", "on", "the", "mat", "."]
    assert tok.tokenize("  Don't  STOP!\n") == ["don", "'", "t", "stop", "!"]


def test_encode_prepends_bos_and_maps_unknown_words(tok):
    ids = tok.encode("The zyzzyva sat")
    assert ids[0] == tok.bos_token_id
    assert ids[2] == tok.unk_token_id
    assert tok.convert_ids_to_tokens(ids) == ["[BOS]", "the", "[UNK]", "sat"]
    assert tok.convert_ids_to_tokens(ids[1]) == "the"


def test_right_and_left_padding(tok):
    right = tok(["The cat sat.", "A dog"])
    left = tok(["The cat sat.", "A dog"], padding_side="left")
    the, cat, sat, dot, a, dog = tok.convert_tokens_to_ids(["the", "cat", "sat", ".", "a", "dog"])
    assert right["input_ids"].tolist() == [[2, the, cat, sat, dot], [2, a, dog, 0, 0]]
    assert right["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert left["input_ids"].tolist() == [[2, the, cat, sat, dot], [0, 0, 2, a, dog]]
    assert left["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert right["input_ids"].dtype == right["attention_mask"].dtype == torch.long


def test_padding_side_attribute_is_the_default():
    tok = WordTokenizer()
    tok.padding_side = "left"
    assert tok(["a", "the cat"])["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]


def test_custom_vocabulary():
    tok = WordTokenizer(["Zebra", "apple", "zebra"], model_max_length=8)
    assert tok.tokenize("zebra apple") == ["zebra", "apple"]
    assert tok.convert_ids_to_tokens(tok.encode("Zebra apple pear")) == [
        "[BOS]",
        "zebra",
        "apple",
        "[UNK]",
    ]
    assert tok.vocab["apple"] == tok.vocab["zebra"] + 1  # duplicates dropped, order kept


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_raises(tok, text):
    with pytest.raises(InputError, match="empty text"):
        tok.tokenize(text)
    with pytest.raises(InputError, match="text 1: empty text") as info:
        tok(["fine", text])
    assert "\n" not in str(info.value)


def test_other_bad_input_raises(tok):
    with pytest.raises(InputError, match="no texts"):
        tok([])
    with pytest.raises(InputError, match="padding_side"):
        tok(["a"], padding_side="middle")
    with pytest.raises(InputError, match="outside the vocabulary"):
        tok.convert_ids_to_tokens([len(tok)])
    with pytest.raises(InputError, match="str"):
        tok.tokenize(3)


def test_too_long_text_raises_unless_truncated(tok):
    text = "the cat sat on the mat"  # 7 ids with [BOS]
    with pytest.raises(InputError, match="7 tokens but max_length is 4"):
        tok([text], max_length=4)
    cut = tok([text], max_length=4, truncation=True)
    assert cut["input_ids"].shape == (1, 4)
    assert tok.convert_ids_to_tokens(cut["input_ids"][0]) == ["[BOS]", "the", "cat", "sat"]
    with pytest.raises(InputError, match="max_length is 64"):
        tok([" ".join(["a"] * 64)])


def test_convert_tokens_to_ids_gives_one_id_for_a_string_like_hf_tokenizers():
    """Issue 17: a string was iterated character by character ("t00" -> [1, 1, 1])."""
    tok = WordTokenizer(["cat", "t00"])
    assert tok.convert_tokens_to_ids("t00") == tok.vocab["t00"]
    assert tok.convert_tokens_to_ids("dog") == tok.unk_token_id
    assert tok.convert_tokens_to_ids(["cat", "t00"]) == [tok.vocab["cat"], tok.vocab["t00"]]


def test_decode_joins_the_tokens_of_ids_and_leaves_padding_out():
    tok = WordTokenizer()
    batch = tok(["The cat sat.", "a dog"])
    assert tok.decode(batch["input_ids"][1]) == "[BOS] a dog"  # [PAD] never shown
    assert tok.decode(batch["input_ids"][0], skip_special_tokens=True) == "the cat sat ."
    assert tok.batch_decode(batch["input_ids"], skip_special_tokens=True) == [
        "the cat sat .", "a dog"]
    assert tok.decode(tok.vocab["cat"]) == "cat"
    assert tok.decode(tok.encode("a zebra")) == "[BOS] a [UNK]"
