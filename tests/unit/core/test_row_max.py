import pytest
import torch

from attnprobe.core.row_max import row_max


@pytest.mark.parametrize("keys", [5, 511, 512, 513, 700, 1024, 1300, 8200])
def test_row_max_equals_max_with_the_first_of_equal_values(keys):
    torch.manual_seed(keys)
    a = (torch.randn(2, 3, 7, keys) * 3).softmax(-1)
    a[0, 0, 0] = 0.0
    a[0, 0, 0, [3, keys - 1]] = 0.5  # a tie across chunks (and into the tail): the first wins
    a[0, 1, 1] = 1.0 / keys  # every value equal: index 0
    a[1, 2, 3, -1] = 2.0  # the largest value in the keys after the last whole chunk
    value, index = row_max(a)
    expected_value, expected_index = a.max(-1)
    assert torch.equal(value, expected_value)
    assert torch.equal(index, expected_index)
    assert int(index[0, 0, 0]) == 3 and int(index[0, 1, 1]) == 0
    assert int(index[1, 2, 3]) == keys - 1
