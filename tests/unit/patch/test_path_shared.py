"""Path patching on models whose MLPs are more than one module called once: a mixture-of-
experts MLP returning a tuple (GPT-OSS), and a layer list holding one layer twice (its MLP runs
at two depths). Each sender's row equals one path patch done with plain torch hooks on the
k-th call of each module (:func:`tests.unit.patch.looped.path_patched`)."""

from __future__ import annotations

import numpy as np
import pytest

import attnprobe as ap
from tests.unit.patch.looped import (
    CLEAN,
    CORRUPT,
    TOL,
    A,
    B,
    Looped,
    gpt_oss,
    inputs,
    looped_llama,
    path_patched,
)


def metric_of(model: Looped, output) -> np.ndarray:
    ids = model.tokenizer.convert_tokens_to_ids([A, B])
    logits = output.logits[:, -1]
    return (logits[:, ids[0]] - logits[:, ids[1]]).double().numpy()


@pytest.mark.parametrize(("build", "receiver", "direction"), [
    (gpt_oss, 1, "denoising"),
    (looped_llama, 2, "denoising"),
    (looped_llama, 2, "noising"),
])
def test_each_sender_equals_one_path_patch_with_plain_hooks(build, receiver, direction):
    model = build()
    clean, corrupt = [CLEAN, CLEAN.replace("w5", "w40")], [CORRUPT, CORRUPT.replace("w25", "w41")]
    table = ap.patch.path(model.model, model.tokenizer, clean, corrupt, f"logit_diff:{A},{B}",
                          receivers=f"layer:{receiver}", direction=direction, batch_size=32)
    base, other = inputs(model, corrupt), inputs(model, clean)
    if direction == "noising":
        base, other = other, base
    senders = {(d, h) for d in range(receiver) for h in range(model.depths[d][0].n_heads)}
    assert set(zip(table["sender_layer"], table["sender_head"], strict=True)) == senders
    for (layer, head), rows in table.groupby(["sender_layer", "sender_head"]):
        want = metric_of(model, path_patched(model, base, other, int(layer), int(head),
                                             receiver))
        np.testing.assert_allclose(rows.sort_values("example_id")["patched"], want, **TOL,
                                   err_msg=f"sender {layer}.{head}")
