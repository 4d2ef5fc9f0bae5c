"""Repeating the examples only from the first patched layer: the layers before it see the
examples once (in the base run: patched forwards replay their outputs), the tables equal one
patched forward at a time, and a model where the repetition or the replay would go wrong (here:
made wrong on purpose) is caught by the check and runs the plain way."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.patch import late_tiling
from attnprobe.patch.late_tiling import LateTiling, blocks_of
from tests.conftest import track
from tests.integration.causal_lms import LM_CLASSES, causal_lm, word_tokenizer
from tests.integration.hf_models import FAMILIES
from tests.unit.patch.inputs import batch_of, metric_values, patched_one

CLEAN = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]
CORRUPT = [[25, 26, 27, 8, 9, 10], [31, 32, 13, 34, 15, 16]]


def runs_of(block: torch.nn.Module, runs: list[int]):
    """A hook counting the runs of ``block``'s first submodule (a replayed block runs none)."""
    inner = next(iter(block.children()))
    return inner.register_forward_hook(lambda module, args, output: runs.append(1))


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
    options = dict(scope="layer:1", metric_positions="all", batch_size=8)
    first, second = [], []
    handles = [rows_seen(blocks[0], first), rows_seen(blocks[1], second)]
    try:
        table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", **options)
    finally:
        for handle in handles:
            handle.remove()
    late = LateTiling(model)
    assert late.checked is True and late.replays is True
    # the clean/corrupted runs, the checks (2 examples once) and the patches (4 heads x 2
    # examples in one forward) see the 2 examples at layer 0; only the one-time check of the
    # first patched forward against the inputs repeated runs 8 rows through it
    assert first == [2, 2, 2, 2, 2, 8] and max(second) == 8
    assert late.confirmed is True
    runs = []
    handle = runs_of(blocks[0], runs)
    try:
        again = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", **options)
    finally:
        handle.remove()
    assert len(runs) == 2  # the clean and the corrupted run; the patched forward replays
    pd.testing.assert_frame_equal(again, table)
    plain = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", per="layer", **options)
    assert len(plain) == 2 and len(table) == 8


def three_layers(name: str):
    """A seeded 3-layer tiny ``name`` model (transformers; BERT as an encoder) and its
    tokenizer."""
    torch.manual_seed(0)
    config = FAMILIES[name].config()
    if name == "gpt2":
        config.n_layer = 3
    else:
        config.num_hidden_layers = 3
    model_class = FAMILIES[name].model if name == "bert" else LM_CLASSES[name]
    return track(model_class(config).eval()), word_tokenizer(bos=name != "gpt2")


def first_state(output, batch):
    """An encoder's metric: the first position's last hidden state on a fixed direction."""
    hidden = output.last_hidden_state
    return hidden[:, 0] @ torch.linspace(-1, 1, hidden.shape[-1])


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_every_head_of_every_layer_equals_one_patched_forward_at_a_time(name):
    """3 layers x 4 heads, 2 examples, 5 patches per forward: layer 0's heads share the
    first forward with a head of layer 1 (repeated from layer 0), layer 1's other heads and
    layer 2's have their own (repeated from their layer)."""
    model, tok = three_layers(name)
    metric, options = (first_state, {}) if name == "bert" else \
        ("logit:next", {"metric_positions": "all"})
    table = ap.patch.heads(model, tok, CLEAN, CORRUPT, metric, batch_size=10, **options)
    late = LateTiling(model)
    assert len(table) == 2 * 12 and late.checked is True and late.replays is True
    base, other = batch_of(CORRUPT), batch_of(CLEAN)
    for (layer, head), rows in table.groupby(["layer", "head"]):
        out = patched_one(model, base, other, "output", int(layer), int(head))
        want = first_state(out, base) if name == "bert" else \
            metric_values("logit:next", tok, out, base, "all", other)
        np.testing.assert_allclose(rows.sort_values("example_id")["patched"],
                                   want.double().numpy(), atol=1e-5, rtol=1e-5,
                                   err_msg=f"L{layer}H{head}")


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


def test_a_model_the_replay_gets_wrong_is_caught_and_runs_its_early_layers(monkeypatch):
    model, tok = ap.load_model("ref:llama")
    model = track(copy.deepcopy(model))
    options = dict(scope="layer:1", metric_positions="all", batch_size=8)
    expected = ap.patch.heads(copy.deepcopy(model), tok, CLEAN, CORRUPT, "logit:next",
                              **options)
    real = late_tiling._replayed

    def swapped(value):  # the examples of a block's output in reverse order
        if isinstance(value, torch.Tensor):
            return value.flip(0) if value.ndim else value
        return type(value)(swapped(v) for v in value) if isinstance(value, tuple) else value

    monkeypatch.setattr(late_tiling, "_replayed",
                        lambda block, output: real(block, swapped(output)))
    table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", **options)
    late = LateTiling(model)
    assert late.checked is True and late.replays is False  # repeats, but runs layer 0
    pd.testing.assert_frame_equal(table, expected, check_exact=False, atol=1e-5, rtol=1e-5)


def test_models_whose_layers_are_not_items_of_one_list_are_left_alone():
    model, _tok = ap.load_model("ref:llama")
    shared = track(copy.deepcopy(model))
    shared.blocks[1] = shared.blocks[0]  # one module at two depths: counted by its calls
    assert blocks_of(shared) == {0: shared.blocks[0], 1: shared.blocks[0]}
    outside = track(copy.deepcopy(model))
    outside.blocks = torch.nn.Sequential(*outside.blocks)  # not a ModuleList
    assert blocks_of(outside) is None and LateTiling(outside).usable is False
    empty = track(copy.deepcopy(model))
    empty.blocks.append(torch.nn.Identity())  # an item holding no attention
    assert blocks_of(empty) is None
