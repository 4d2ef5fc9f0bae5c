"""Attribution patching on models that run one attention module at several depths (ALBERT's
shared layer, a layer list holding one layer twice): each head's estimate equals the base
metric plus ``Σ (z_other − z_base) · ∂m/∂z`` with the gradient taken, in plain torch, at the
k-th call of the shared output projection (:mod:`tests.unit.patch.looped`)."""

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
    inputs,
    masked,
    on_call,
    read_run,
)


def metric_of(model: Looped, output) -> torch.Tensor:
    ids = model.tokenizer.convert_tokens_to_ids([A, B])
    logits = output.logits[:, 2 if masked(model) else -1]
    return logits[:, ids[0]] - logits[:, ids[1]]


def gradient_at(model: Looped, batch, depth: int) -> tuple[np.ndarray, torch.Tensor]:
    """``(metric [example], ∂Σm/∂z at depth [example, seq, heads·d_head])``."""
    attn, call = model.depths[depth]
    leaf: list[torch.Tensor] = []

    def take(args):
        leaf.append(args[0].detach().requires_grad_(True))
        return (leaf[0], *args[1:])

    handle = on_call(attn.o, call, take, pre=True)
    try:
        with torch.enable_grad():
            m = metric_of(model, model.model(**batch))
            m.sum().backward()
    finally:
        handle.remove()
    return m.detach().double().numpy(), leaf[0].grad


@pytest.mark.parametrize("name", list(BUILDERS))
def test_each_estimate_equals_a_gradient_at_the_depths_own_call(name):
    model = BUILDERS[name]()
    table = ap.patch.attribution(model.model, model.tokenizer, [CLEAN, CLEAN],
                                 [CORRUPT, CORRUPT], f"logit_diff:{A},{B}",
                                 **({"metric_positions": [2]} if masked(model) else {}))
    base, other = inputs(model, [CORRUPT, CORRUPT]), inputs(model, [CLEAN, CLEAN])
    z_base, z_other = read_run(model, base), read_run(model, other)
    assert len(table) == 2 * len(model.depths) * 4
    for depth, (attn, _) in enumerate(model.depths):
        value, grad = gradient_at(model, base, depth)
        delta = (z_other[depth]["z"] - z_base[depth]["z"]) * grad
        for head in range(attn.n_heads):
            cut = slice(head * attn.d_head, (head + 1) * attn.d_head)
            want = value + delta[..., cut].sum((-1, -2)).double().numpy()
            rows = table[(table["layer"] == depth) & (table["head"] == head)]
            np.testing.assert_allclose(rows.sort_values("example_id")["patched"], want, **TOL,
                                       err_msg=f"depth {depth} head {head}")
