"""Key-token tasks: labels and decisive masks recomputed independently, balance, determinism,
token positions under WordTokenizer, and input errors."""

from __future__ import annotations

import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.models.tokenizer import DEFAULT_WORDS, WordTokenizer
from attnprobe.tasks.keytoken import KEY_TOKEN_TASKS, WORDS, make_examples, vocabulary


def expected(task: str, words: list[str]) -> tuple[int, list[bool]]:
    """The task's rule, written out again by hand."""
    if task == "contains":
        return int(sum(w == "key" for w in words) > 0), [w == "key" for w in words]
    if task == "count":
        n_cat = sum(1 for w in words if w == "cat")
        n_dog = sum(1 for w in words if w == "dog")
        return int(n_cat > n_dog), [w in {"cat", "dog"} for w in words]
    assert task == "first_last"
    last = len(words) - 1
    return int(words[0] == words[last]), [i == 0 or i == last for i in range(len(words))]


@pytest.mark.parametrize("task", KEY_TOKEN_TASKS.names())
def test_labels_and_decisive_masks_follow_the_rule(task):
    data = make_examples(task, 101, min_len=2, max_len=9, vocab_words=12, seed=3)
    assert len(data) == len(data.texts) == len(data.labels) == len(data.decisive) == 101
    vocab = set(vocabulary(12))
    for text, label, mask in zip(data.texts, data.labels.tolist(), data.decisive, strict=True):
        words = text.split(" ")
        assert 2 <= len(words) <= 9 and set(words) <= vocab
        want_label, want_mask = expected(task, words)
        assert label == want_label
        assert mask.dtype == torch.bool and mask.tolist() == want_mask


@pytest.mark.parametrize("task", KEY_TOKEN_TASKS.names())
def test_labels_are_balanced(task):
    for n in (1, 2, 7, 100):
        labels = make_examples(task, n, min_len=3, max_len=8, seed=n).labels
        assert int(labels.sum()) == n // 2  # the extra example of an odd n is a negative
        assert set(labels.tolist()) <= {0, 1}


@pytest.mark.parametrize("task", KEY_TOKEN_TASKS.names())
def test_examples_are_deterministic_from_the_seed(task):
    one = make_examples(task, 40, min_len=3, max_len=10, seed=5)
    two = make_examples(task, 40, min_len=3, max_len=10, seed=5)
    other = make_examples(task, 40, min_len=3, max_len=10, seed=6)
    assert one.texts == two.texts and torch.equal(one.labels, two.labels)
    assert all(torch.equal(a, b) for a, b in zip(one.decisive, two.decisive, strict=True))
    assert one.texts != other.texts
    state = torch.get_rng_state()
    make_examples(task, 5, seed=0)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is untouched


def test_contains_negatives_have_no_decisive_word_and_positives_some():
    data = make_examples("contains", 200, min_len=1, max_len=16, seed=0)
    assert torch.equal(data.has_decisive, data.labels.bool())
    counts = [int(m.sum()) for m in data.decisive]
    assert {c for c, y in zip(counts, data.labels.tolist(), strict=True) if y} <= {1, 2, 3}
    assert max(counts) > 1  # several keys occur


def test_count_examples_always_hold_a_decisive_word_and_include_ties():
    data = make_examples("count", 300, min_len=1, max_len=12, seed=1)
    assert bool(data.has_decisive.all())
    ties = [words.count("cat") == words.count("dog") for words in data.words]
    assert any(ties)  # ties are label 0 by the rule
    assert all(y == 0 for y, tie in zip(data.labels.tolist(), ties, strict=True) if tie)


def test_first_last_needs_two_words():
    with pytest.raises(InputError, match="min_len"):
        make_examples("first_last", 4, min_len=1, max_len=5)


def test_token_decisive_matches_word_tokenizer_positions():
    data = make_examples("contains", 30, min_len=3, max_len=8, seed=2)
    tok = WordTokenizer(WORDS)
    key_id = tok.convert_tokens_to_ids(["key"])[0]
    for text, mask in zip(data.texts, data.token_decisive(), strict=True):
        ids = torch.tensor(tok.encode(text))
        assert ids[0] == tok.bos_token_id and len(ids) == len(mask)
        assert torch.equal(mask, ids == key_id)
    assert all(len(m) == len(d) for m, d in zip(data.token_decisive(0), data.decisive,
                                                  strict=True))
    with pytest.raises(InputError):
        data.token_decisive(-1)


def test_every_word_is_known_to_the_default_tokenizer():
    assert set(WORDS) <= set(DEFAULT_WORDS.split())
    assert len(set(WORDS)) == len(WORDS)
    ids = WordTokenizer().convert_tokens_to_ids(list(WORDS))
    assert WordTokenizer.unk_token_id not in ids


def test_select_keeps_examples_in_order():
    data = make_examples("count", 10, seed=4)
    part = data.select([7, 2])
    assert part.texts == [data.texts[7], data.texts[2]]
    assert part.labels.tolist() == [int(data.labels[7]), int(data.labels[2])]
    assert torch.equal(part.decisive[0], data.decisive[7]) and part.task == "count"


@pytest.mark.parametrize("kwargs, match", [
    ({"task": "nope"}, "unknown key-token task 'nope'"),
    ({"n": 0}, "n must be"),
    ({"min_len": 5, "max_len": 4}, "min_len"),
    ({"min_len": 0}, "min_len"),
    ({"vocab_words": 4}, "vocab_words"),
    ({"vocab_words": len(WORDS) + 1}, "vocab_words"),
])
def test_bad_arguments_are_input_errors(kwargs, match):
    args = {"task": "contains", "n": 4, **kwargs}
    with pytest.raises(InputError, match=match):
        make_examples(args.pop("task"), args.pop("n"), **args)
