"""Repeating the examples only from the first patched layer: the layers before it see the
examples once, the tables equal those of repeated inputs, and a model where the repetition
would go wrong (here: made wrong on purpose) is caught by the check and runs the plain way."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.patch import late_tiling
from attnprobe.patch.late_tiling import LateTiling, blocks_of
from tests.conftest import track
from tests.integration.causal_lms import causal_lm

CLEAN = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]
CORRUPT = [[25, 26, 27, 8, 9, 10], [31, 32, 13, 34, 15, 16]]


def rows_seen(module: torch.nn.Module, seen: list[int]):
    """A hook noting the rows of each output of ``module`` (a block)."""
    def note(module, args, output):
        seen.append((output[0] if isinstance(output, tuple) else output).shape[0])
    return module.register_forward_hook(note)


@pytest.mark.parametrize("name", ["ref:llama", "gpt2"])
def test_layers_before_the_patched_one_see_the_examples_once(name):
    if name == "gpt2":
        model, tok = causal_lm("gpt2")
        blocks = model.transformer.h
    else:
        model, tok = ap.load_model(name)
        model = track(copy.deepcopy(model))  # a model of its own: its check runs here
        blocks = model.blocks
    assert blocks_of(model) == dict(enumerate(blocks))
    first, second = [], []
    handles = [rows_seen(blocks[0], first), rows_seen(blocks[1], second)]
    try:
        table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", scope="layer:1",
                               metric_positions="all", batch_size=8)
    finally:
        for handle in handles:
            handle.remove()
    assert LateTiling(model).checked is True
    # the clean/corrupted runs, the check (2 examples once) and the patches (4 heads x 2
    # examples in one forward): layer 0 never sees more than the 2 examples
    assert max(first) == 2 and max(second) == 8
    plain = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", scope="layer:1",
                           metric_positions="all", batch_size=8, per="layer")
    assert len(plain) == 2 and len(table) == 8


def test_a_model_the_repetition_gets_wrong_is_caught_and_runs_the_plain_way(monkeypatch):
    model, tok = ap.load_model("ref:llama")
    model = track(copy.deepcopy(model))
    expected = ap.patch.heads(copy.deepcopy(model), tok, CLEAN, CORRUPT, "logit:next",
                              scope="layer:1", metric_positions="all", batch_size=8)
    real = late_tiling._repeat

    def wrong(value, rows, copies):  # every repetition of the hidden states in reverse order
        if isinstance(value, torch.Tensor) and value.ndim == 3 and value.shape[0] == rows:
            return value.flip(0).repeat(copies, 1, 1)
        return real(value, rows, copies)

    monkeypatch.setattr(late_tiling, "_repeat", wrong)
    table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", scope="layer:1",
                           metric_positions="all", batch_size=8)
    assert LateTiling(model).checked is False
    pd.testing.assert_frame_equal(table, expected, check_exact=False, atol=1e-5, rtol=1e-5)


def test_models_whose_layers_are_not_one_list_of_distinct_modules_are_left_alone():
    model, _tok = ap.load_model("ref:llama")
    shared = track(copy.deepcopy(model))
    shared.blocks[1] = shared.blocks[0]  # one module run twice
    assert blocks_of(shared) is None and LateTiling(shared).usable is False
    outside = track(copy.deepcopy(model))
    outside.blocks = torch.nn.Sequential(*outside.blocks)  # not a ModuleList
    assert blocks_of(outside) is None
