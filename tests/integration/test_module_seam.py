"""The module seam: attention modules that compute their weights themselves (GPT-Neo, Bloom,
Falcon's SDPA path, DeBERTa-v2, MPNet, Longformer's sliding window, XLNet), against the eager
twin's own ``output_attentions`` (transformers' computation, never attnprobe's)."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.capture import EditOutput, Keep, Scores, Values
from tests.integration.legacy_models import LEGACY, build_pair, padded

NAMES = tuple(LEGACY)
ABLATABLE = tuple(name for name in NAMES if LEGACY[name].out_proj is not None)


pytestmark = pytest.mark.usefixtures("one_thread")


def _band_to_full(band: torch.Tensor, seq: int) -> torch.Tensor:
    """Longformer's ``[batch, head, seq, 2w+1]`` (column c of row i is key i - w + c) as
    ``[batch, head, seq, seq]``, written out with loops (independent of attnprobe's)."""
    w = (band.shape[-1] - 1) // 2
    full = torch.zeros(*band.shape[:2], seq, seq)
    for i in range(seq):
        for c in range(band.shape[-1]):
            j = i - w + c
            if 0 <= j < seq:
                full[:, :, i, j] = band[:, :, i, c]
    return full


def eager_reference(twin, inputs) -> list[torch.Tensor]:
    """Per layer, the twin's weights ``[batch, head, query, key]`` over the whole input."""
    with torch.no_grad():
        out = twin(**inputs, output_attentions=True)
    seq = inputs["input_ids"].shape[1]
    return [a if a.shape[-1] == seq else _band_to_full(a, seq) for a in out.attentions]


def real(weights: torch.Tensor, mask: torch.Tensor, b: int) -> torch.Tensor:
    keep = mask[b].bool()
    return weights[b][:, keep][:, :, keep]


def output(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


@pytest.mark.parametrize("name", NAMES)
def test_weights_equal_the_eager_twin_and_outputs_are_unchanged(name):
    model, twin = build_pair(name)
    inputs = padded(name)
    plain = output(model, inputs)
    with torch.no_grad(), ap.capture(model) as cap:
        captured = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"]
    real_rows = mask.bool()  # padding rows may differ: SDPA and eager treat them apart
    torch.testing.assert_close(captured[real_rows], plain[real_rows], atol=1e-5, rtol=0)
    reference = eager_reference(twin, inputs)
    assert len(cap.maps) == 2
    for amap in cap.maps:
        b = int(amap.example_id)
        assert amap.layers == (0, 1)
        assert amap.pattern.shape[-1] == int(mask[b].sum())
        for i, layer in enumerate(amap.layers):
            torch.testing.assert_close(amap.pattern[i], real(reference[layer], mask, b),
                                       atol=1e-5, rtol=0)
    assert "own modules" in cap.maps[0].info.attn_implementation
    assert torch._C._len_torch_function_stack() == 0  # the seam's reader left with the forward


def _zero_head0(module, args):
    x = args[0].clone()
    x[..., :x.shape[-1] // 4] = 0  # head 0's slice of the projection's input
    return (x, *args[1:])


@pytest.mark.parametrize("name", ABLATABLE)
def test_zeroing_a_head_equals_zeroing_its_output_on_the_twin(name):
    """An edit flows into the module's own value product: zeroing head 0 of layer 0 gives
    the output of the twin whose head-0 slice before the output projection is zeroed."""
    model, twin = build_pair(name)
    inputs = padded(name)

    def ablate(layer, pattern):
        pattern[:, 0] = 0
        return pattern

    with torch.no_grad(), ap.capture(model, "layer:0", edit=ablate) as cap:
        edited = model(**inputs).last_hidden_state
    handle = twin.get_submodule(LEGACY[name].out_proj).register_forward_pre_hook(_zero_head0)
    try:
        expected = output(twin, inputs)
    finally:
        handle.remove()
    mask = inputs["attention_mask"].bool()
    torch.testing.assert_close(edited[mask], expected[mask], atol=1e-5, rtol=0)
    assert (edited[mask] - output(model, inputs)[mask]).abs().max() > 1e-3
    assert cap.edits["max_abs_change"].max() > 0
    assert cap.maps[0].head(0, 0).abs().max() == 0


@pytest.mark.parametrize("name", ["gpt_neo", "falcon", "mpnet"])
def test_scores_are_the_softmax_input(name):
    model, _ = build_pair(name)
    inputs = padded(name)
    with torch.no_grad(), ap.capture(model, parts=[Keep(), Scores()]) as cap:
        model(**inputs)
    for amap in cap.maps:
        torch.testing.assert_close(amap.scores.softmax(-1), amap.pattern, atol=1e-5, rtol=0)


def test_a_scope_runs_only_its_layers_through_the_reader():
    model, twin = build_pair("bloom")
    inputs = padded("bloom")
    with torch.no_grad(), ap.capture(model, "head:1.2") as cap:
        model(**inputs)
    reference = eager_reference(twin, inputs)
    for amap in cap.maps:
        assert (amap.layers, amap.heads) == ((1,), (2,))
        b = int(amap.example_id)
        torch.testing.assert_close(amap.pattern[0, 0], real(reference[1], inputs[
            "attention_mask"], b)[2], atol=1e-5, rtol=0)


@pytest.mark.parametrize("part", [Values(), EditOutput(lambda layer, out: out * 0)])
def test_parts_the_modules_cannot_serve_are_refused_before_any_forward(part):
    model, _ = build_pair("gpt_neo")
    with pytest.raises(ap.InputError, match="own attention modules"), \
            ap.capture(model, parts=[Keep(), part]):
        pytest.fail("the capture should not open")


def test_an_error_inside_the_forward_leaves_no_hook_or_reader():
    model, _ = build_pair("gpt_neo")

    def broken(layer, pattern):
        raise RuntimeError("edit failed")

    with pytest.raises(RuntimeError, match="edit failed"), torch.no_grad(), \
            ap.capture(model, edit=broken):
        model(**padded("gpt_neo"))
    assert ap.count_hooks(model) == 0
    assert torch._C._len_torch_function_stack() == 0


def test_longformer_global_attention_is_a_one_line_refusal():
    model, _ = build_pair("longformer")
    inputs = padded("longformer")
    glob = torch.zeros_like(inputs["attention_mask"])
    glob[:, 0] = 1
    with pytest.raises(ap.AttentionUnavailableError, match="global attention"), \
            torch.no_grad(), ap.capture(model):
        model(**inputs, global_attention_mask=glob)
    assert ap.count_hooks(model) == 0


def test_another_threads_forward_ending_inside_a_captured_run_leaves_that_run_alone():
    """Thread A's capture is inside layer 0's attention (before its softmax) when thread B,
    capturing nothing, runs a whole forward of the same model: B's module ends must not
    close A's open run, so A still reads every layer, equal to the eager twin."""
    import threading

    model, twin = build_pair("bloom")
    inputs = padded("bloom")
    inside, done = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def wait_for_b(module, args):
        if threading.current_thread().name == "a" and not done.is_set():
            inside.set()
            done.wait(60)

    def run_a():
        try:
            with torch.no_grad(), ap.capture(model) as cap:
                model(**inputs)
            outcome["a"] = cap
        except BaseException as exc:  # reported below
            outcome["a"] = exc

    def run_b():
        try:
            inside.wait(60)
            with torch.no_grad():
                model(**inputs)
        except BaseException as exc:  # reported below
            outcome["b"] = exc
        finally:
            done.set()

    handle = model.get_submodule("h.0.self_attention.query_key_value").register_forward_pre_hook(
        wait_for_b)
    try:
        threads = [threading.Thread(target=run_a, name="a"), threading.Thread(target=run_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        handle.remove()
    assert "b" not in outcome, outcome["b"]
    cap = outcome["a"]
    assert isinstance(cap, ap.Capture), cap
    reference = eager_reference(twin, inputs)
    assert len(cap.maps) == 2
    for amap in cap.maps:
        b = int(amap.example_id)
        assert amap.layers == (0, 1)
        for i, layer in enumerate(amap.layers):
            torch.testing.assert_close(amap.pattern[i],
                                       real(reference[layer], inputs["attention_mask"], b),
                                       atol=1e-5, rtol=0)

