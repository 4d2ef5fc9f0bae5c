import math

import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.tasks import (
    ALIGNMENT_TASKS,
    BOS,
    EOS,
    PAD,
    alignment_accuracy,
    alignment_error_rate,
    attention_aer,
    corpus_bleu,
    gold_mass,
    lexicon,
    make_batch,
    sequence_accuracy,
)


def real(batch, i):
    n = int(batch.source_mask[i].sum())
    return batch.source[i, :n], batch.labels[i, :n]


@pytest.mark.parametrize("task", ALIGNMENT_TASKS.names())
def test_targets_follow_the_alignment(task):
    batch = make_batch(task, 6, min_len=3, max_len=9, vocab_size=20, seed=1)
    table = lexicon(20)
    for i, pi in enumerate(batch.alignment):
        src, tgt = real(batch, i)
        expected = src[pi] if task != "translation" else table[src[pi]]
        assert torch.equal(tgt, expected)
        assert sorted(pi.tolist()) == list(range(len(src)))  # a permutation
        assert batch.labels[i, len(src)] == EOS and batch.decoder_input[i, 0] == BOS
        assert torch.equal(batch.decoder_input[i, 1 : len(src) + 1], tgt)


def test_known_alignments():
    words = torch.tensor([5, 3, 9, 3, 7])
    gen = torch.Generator()
    assert ALIGNMENT_TASKS.get("copy")(words, gen).tolist() == [0, 1, 2, 3, 4]
    assert ALIGNMENT_TASKS.get("reverse")(words, gen).tolist() == [4, 3, 2, 1, 0]
    assert ALIGNMENT_TASKS.get("sort")(words, gen).tolist() == [1, 3, 0, 4, 2]  # ties by position
    assert ALIGNMENT_TASKS.get("bigram_flip")(words, gen).tolist() == [1, 0, 3, 2, 4]


def test_lexicon_moves_every_word_and_keeps_specials():
    table = lexicon(12)
    assert table[:3].tolist() == [PAD, BOS, EOS]
    assert sorted(table[3:].tolist()) == list(range(3, 12))
    assert (table[3:] != torch.arange(3, 12)).all()


def test_padding_and_bad_sizes():
    batch = make_batch("copy", 4, min_len=2, max_len=6, seed=0)
    assert ((batch.source == PAD) == (batch.source_mask == 0)).all()
    with pytest.raises(InputError):
        make_batch("copy", 0, min_len=2, max_len=6)
    with pytest.raises(InputError):
        make_batch("copy", 2, min_len=5, max_len=3)
    with pytest.raises(KeyError, match="choose one of"):
        make_batch("nope", 2, min_len=2, max_len=3)


def test_alignment_scores_by_construction():
    truth = torch.tensor([2, 0, 1])
    perfect = torch.eye(3)[truth]
    assert alignment_accuracy(perfect, truth) == 1.0
    assert gold_mass(perfect, truth) == 1.0
    assert attention_aer(perfect, truth) == 0.0
    uniform = torch.full((3, 3), 1 / 3)
    assert gold_mass(uniform, truth) == pytest.approx(1 / 3)
    wrong = torch.eye(3)[torch.tensor([0, 1, 2])]
    assert attention_aer(wrong, truth) == 1.0
    # |A|=2, |S|=2, one hit, P = S: 1 - 2/4
    assert alignment_error_rate({(0, 0), (1, 1)}, {(0, 0), (1, 0)}) == pytest.approx(0.5)
    # a possible-only hit counts once: 1 - (1 + 2) / (2 + 1)
    assert alignment_error_rate({(0, 0), (1, 1)}, {(0, 0)}, {(1, 1)}) == pytest.approx(0.0)


def test_bleu_against_hand_computed_values():
    assert corpus_bleu([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == pytest.approx(100.0)
    # precisions 4/5, 3/4, 2/3, 1/2; equal lengths so no brevity penalty
    expected = 100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    assert corpus_bleu([[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 6]]) == pytest.approx(expected)
    # all precisions 1, candidate 4 vs reference 6 tokens
    assert corpus_bleu([[1, 2, 3, 4]], [[1, 2, 3, 4, 5, 6]]) == pytest.approx(
        100 * math.exp(1 - 6 / 4))
    assert corpus_bleu([[7, 7, 7, 7]], [[7, 1, 2, 3]]) == 0.0  # clipped unigrams, no bigram
    assert sequence_accuracy([[1, 2], [3]], [[1, 2], [4]]) == 0.5
