"""Fault 7 of issue 11: an edit that changes its argument in place and returns it is an edit
(the old code compared the result with the already-changed tensor and raised
EditNotAppliedError), on the HF seam and on hook points alike."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.models import build_reference
from tests.conftest import track
from tests.integration.hf_models import build, build_pair
from tests.unit.capture.tiny import batch, eager_attentions, hidden


def zero_head(head, *, in_place):
    """An edit of ``[batch, head, ...]`` weights or outputs that zeroes one head, either in
    its argument (returned) or in a copy."""
    def edit(layer, tensor):
        tensor = tensor if in_place else tensor.clone()
        tensor[:, head] = 0
        return tensor
    return edit


def _both(model, inputs, out_of):
    """(output, capture) of the in-place and the out-of-place edit of head 3's weights."""
    runs = []
    for edit in (zero_head(3, in_place=True), zero_head(3, in_place=False)):
        with torch.no_grad(), ap.capture(model, edit=edit) as cap:
            runs.append((out_of(model(**inputs)), cap))
    return runs


def _assert_same_edit(in_place, copy, plain):
    (out_a, cap_a), (out_b, cap_b) = in_place, copy
    assert torch.equal(out_a, out_b)  # exactly what the out-of-place edit does
    assert (out_a - plain).abs().max().item() > 1e-3  # and it did change the output
    pd.testing.assert_frame_equal(cap_a.edits, cap_b.edits)
    assert (cap_a.edits["max_abs_change"] > 0).all()
    for a, b in zip(cap_a.maps, cap_b.maps, strict=True):
        assert torch.equal(a.pattern, b.pattern)
        assert a.pattern[:, 3].abs().max().item() == 0.0


@pytest.mark.parametrize("name", ("bert", "llama"))
def test_in_place_edit_on_the_hf_seam(name):
    model, twin = build_pair(name)
    inputs = batch(name, (9, 5))
    plain = hidden(model, inputs)
    in_place, copy = _both(model, inputs, lambda out: out.last_hidden_state)
    _assert_same_edit(in_place, copy, plain)
    # layer 0 sees the unedited input: its change is the largest weight head 3 had there
    eager = eager_attentions(twin, inputs)  # [batch, layer, head, query, key], padding too
    edits = in_place[1].edits.set_index("layer")["max_abs_change"]
    assert edits.loc[0] == pytest.approx(eager[:, 0, 3].max().item(), abs=1e-6)


def test_in_place_edit_on_hook_points():
    model, tok = build_reference("transformer")
    track(model)
    inputs = tok(["the cat sat on the mat", "a dog"])
    layer0 = {}
    handle = model.get_submodule("blocks.0.attn.hook_pattern").register_forward_hook(
        lambda m, a, out: layer0.__setitem__("pattern", out.detach().clone()))
    try:
        with torch.no_grad():
            plain = model(**inputs)
    finally:
        handle.remove()
    in_place, copy = _both(model, inputs, lambda out: out)
    _assert_same_edit(in_place, copy, plain)
    edits = in_place[1].edits.set_index("layer")["max_abs_change"]
    assert edits.loc[0] == pytest.approx(layer0["pattern"][:, 3].max().item(), abs=1e-6)


def test_in_place_output_edit():
    model = build("bert")
    inputs = batch("bert", (9, 5))
    plain = hidden(model, inputs)

    outs = []
    for edit in (zero_head(1, in_place=True), zero_head(1, in_place=False)):
        with torch.no_grad(), ap.capture(model, keep=False, edit_output=edit) as cap:
            outs.append(model(**inputs).last_hidden_state)
        assert (cap.edits["max_abs_change"] > 0).all()
    assert torch.equal(outs[0], outs[1])
    assert (outs[0] - plain).abs().max().item() > 1e-3
