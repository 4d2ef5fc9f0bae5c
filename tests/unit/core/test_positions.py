"""Where a metric reads (issue 24, items 10 and 14): a scalar position is that one position,
``None`` is the default (the last real token; every position with a next token for the
metrics that read it), any other kind is a one-line error naming the argument, and a bool
mask must fit the inputs exactly (no mark on padding, width equal to the longest input).
Expected masks are written out by hand."""

from __future__ import annotations

import pytest
import torch

from attnprobe.core.positions import check_positions, fit_positions, positions_mask
from attnprobe.errors import InputError

# example 0 is left-padded (3 real tokens), example 1 has 5
BATCH = {"input_ids": torch.ones(2, 5, dtype=torch.long),
         "attention_mask": torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])}


def rows(*marked: list[int]) -> list[list[bool]]:
    return [[slot in wanted for slot in range(5)] for wanted in marked]


def test_a_scalar_is_that_one_position():
    assert positions_mask(1, BATCH).tolist() == rows([3], [1])
    assert positions_mask(-1, BATCH).tolist() == positions_mask("last", BATCH).tolist()
    assert positions_mask(torch.tensor(1), BATCH).tolist() == rows([3], [1])


def test_none_is_the_default():
    assert positions_mask(None, BATCH).tolist() == rows([4], [4])
    # a metric reading the next token: every position that has one
    assert positions_mask(None, BATCH, needs_next=True).tolist() == rows([2, 3], [0, 1, 2, 3])


@pytest.mark.parametrize("bad", [2.5, {"a": 1}, {1, 2}, [1.5], [[1], "x"], [True],
                                 torch.tensor([0.5]), object()])
def test_other_kinds_are_a_one_line_error_naming_the_argument(bad):
    with pytest.raises(InputError, match="metric_positions") as err:
        check_positions(bad, "metric_positions")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="positions"):
        positions_mask(bad, BATCH)


def test_a_mask_marking_padding_is_an_error_not_dropped():
    mask = torch.tensor(rows([1, 3], [1]))  # slot 1 of example 0 is left padding
    with pytest.raises(InputError, match=r"example 0.*padding") as err:
        positions_mask(mask, BATCH)
    assert "\n" not in str(err.value)


def test_a_corpus_mask_must_be_as_wide_as_the_longest_input():
    lengths = [5, 3, 4]
    for width in (4, 6):
        mask = torch.zeros(3, width, dtype=torch.bool)
        mask[:, 0] = True
        with pytest.raises(InputError, match=r"\[3, 5\]") as err:
            fit_positions(mask, lengths, "metric_positions")
        assert "metric_positions" in str(err.value) and "\n" not in str(err.value)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[:, 0] = True
    assert fit_positions(mask, lengths, "metric_positions") is mask


def test_a_corpus_mask_marking_past_an_inputs_end_names_it():
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[:, 0] = True
    mask[1, 3] = True  # example 1 has 3 tokens
    with pytest.raises(InputError, match=r"position 3 of example 1 \(3 tokens\)"):
        fit_positions(mask, [5, 3, 4], "metric_positions")
    with pytest.raises(InputError, match="rows"):
        fit_positions(mask[:2], [5, 3, 4], "metric_positions")


def test_integer_positions_past_either_end_name_the_example_and_position():
    lengths = [5, 3, 4]
    assert fit_positions([-3, 2], lengths, "p") == [-3, 2]   # in range for every example
    assert fit_positions(2, lengths, "p") == [2]
    for bad, example in (([3], 1), ([-4], 1), ([[0], [0], [4]], 2), ([[0], [-4], [0]], 1)):
        p = bad[0] if not isinstance(bad[0], list) else bad[example][0]
        with pytest.raises(InputError, match=rf"position {p} .*example {example}"):
            fit_positions(bad, lengths, "p")
    with pytest.raises(InputError, match="2 lists for 3 examples"):
        fit_positions([[0], [1]], lengths, "p")


def test_skipped_inputs_are_not_checked():
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask[:, 2] = True  # input 1 was left out (too long): its row is not read
    assert fit_positions(mask, [3, None], "p") is mask
    assert fit_positions([[2], [9]], [3, None], "p") == [[2], [9]]
