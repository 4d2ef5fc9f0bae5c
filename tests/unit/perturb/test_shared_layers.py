"""Batched head sweeps (an intervention, a knockout) on models that run one attention module
at several depths — ALBERT's shared layer, a layer list holding one layer twice — equal one
forward per head with plain torch hooks on the module's k-th call
(:mod:`tests.unit.patch.looped`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnprobe as ap
from tests.unit.patch.looped import (
    BUILDERS,
    CLEAN,
    CORRUPT,
    TOL,
    A,
    B,
    Looped,
    head_replaced,
    inputs,
    kv_slice,
    masked,
    patterns,
)

KEY = 1  # the knockout blocks every query's edge to this key (but its own)



def metric_of(model: Looped, output) -> np.ndarray:
    ids = model.tokenizer.convert_tokens_to_ids([A, B])
    logits = output.logits[:, 2 if masked(model) else -1]
    return (logits[:, ids[0]] - logits[:, ids[1]]).double().numpy()


def sweep(model: Looped, experiment: str, **options):
    texts = [CLEAN, CORRUPT]
    return ap.perturb.run(model.model, model.tokenizer, texts, experiment, sweep="head",
                          metric=f"logit_diff:{A},{B}",
                          positions=[2] if masked(model) else "last", batch_size=32,
                          **options)


def assert_rows(model: Looped, table, make) -> None:
    """Each head's ``perturbed`` against ``make(depth, head, batch, weights)``'s output."""
    batch = inputs(model, [CLEAN, CORRUPT])
    weights = patterns(model, batch)
    n_heads = model.depths[0][0].n_heads
    assert len(table) == 2 * len(model.depths) * n_heads
    for (layer, head), rows in table.groupby(["layer", "head"]):
        output = make(int(layer), int(head), batch, weights)
        np.testing.assert_allclose(rows.sort_values("example_id")["perturbed"],
                                   metric_of(model, output), **TOL,
                                   err_msg=f"depth {layer} head {head}")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_zero_ablation_sweep_equals_one_ablated_head_per_forward(name):
    model = BUILDERS[name]()
    table = sweep(model, "ablate")

    def make(depth, head, batch, weights):
        return head_replaced(model, batch, depth, head,
                             lambda values: torch.zeros_like(values[..., :8]))
    assert_rows(model, table, make)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_knockout_sweep_equals_one_knocked_out_head_per_forward(name):
    """Blocking key ``KEY`` before the softmax = the head's weights with that column
    zeroed (but on its own row) and each row renormalised, over this call's values."""
    model = BUILDERS[name]()
    table = sweep(model, "knockout", edges=f"to:{KEY}")

    def make(depth, head, batch, weights):
        kept = weights[depth][:, head].clone()
        others = torch.arange(kept.shape[-2]) != KEY
        kept[:, others, KEY] = 0
        kept = kept / kept.sum(-1, keepdim=True)
        attn = model.depths[depth][0]
        return head_replaced(model, batch, depth, head,
                             lambda values: kept @ values[..., kv_slice(attn, head)])
    assert_rows(model, table, make)
