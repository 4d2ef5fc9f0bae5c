"""Fault 4 of issue 11: half-precision models capture like float32 ones (row sums checked to
the precision of the dtype the weights were computed in), and an edit that overflows float16
is an InputError, never inf in the output."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from attnprobe.core.divergence import row_sum_tolerance
from attnprobe.heads import default_reducers, summarize
from attnprobe.models import build_reference
from tests.conftest import track
from tests.integration.hf_models import build, build_pair, implementations
from tests.unit.capture.tiny import batch, eager_maps, hidden

HALF = (torch.bfloat16, torch.float16)
THREE = ("bert", "gpt2", "llama")


def _half_pair(name, dtype):
    model, twin = build_pair(name)
    return model.to(dtype), twin.to(dtype)


def _worst_row(maps) -> float:
    return max((m.pattern.sum(-1) - 1).abs().max().item() for m in maps)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", THREE)
def test_half_precision_capture_equals_eager(name, dtype):
    model, twin = _half_pair(name, dtype)
    inputs = batch(name, (9, 5))
    with torch.no_grad(), ap.capture(model) as cap:
        out = model(**inputs).last_hidden_state
    with torch.no_grad():
        eager_out = twin(**inputs).last_hidden_state
    # the seam runs the model's own eager function: the same numbers as the eager twin
    assert torch.equal(out, eager_out)
    expected = eager_maps(twin, inputs)
    assert len(cap.maps) == len(expected)
    for amap, want in zip(cap.maps, expected, strict=True):
        assert amap.info.dtype == str(dtype).removeprefix("torch.")
        assert amap.shape == tuple(want.shape)
        assert torch.equal(amap.pattern, want.float())
    worst = _worst_row(cap.maps)
    assert worst <= row_sum_tolerance(dtype)
    if dtype == torch.bfloat16:  # float32's tolerance (1e-3) would refuse these rows
        assert worst > 1e-3


@pytest.mark.parametrize("name", THREE)
def test_bfloat16_streaming_statistics_equal_the_kept_maps(name):
    model, _ = _half_pair(name, torch.bfloat16)
    inputs = batch(name, (9, 5))
    with torch.no_grad(), ap.capture(model) as kept:
        model(**inputs)
    with torch.no_grad(), ap.capture(model, keep=False, reducers=default_reducers(),
                                     query_block=2) as streamed:
        model(**inputs)
    keys = ["stack", "kind", "layer", "head"]
    a = summarize(kept.maps).sort_values(keys).reset_index(drop=True)
    b = streamed.tally.summary().sort_values(keys).reset_index(drop=True)
    numeric = [c for c in a.select_dtypes("number").columns if c not in keys]
    assert (a[numeric] - b[numeric]).abs().max().max() <= 1e-5


@pytest.mark.parametrize("name", THREE)
def test_float32_model_under_bfloat16_autocast(name):
    """Parameters in float32, attention computed where autocast says so (GPT-2's weights come
    out in bfloat16, BERT's and LLaMA's in float32): the maps carry the dtype of their weights
    and are checked to its precision (the old code checked GPT-2's to float32's and failed)."""
    model, twin = build_pair(name)
    inputs = batch(name, (9, 5))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with ap.capture(model) as cap:
            out = model(**inputs).last_hidden_state
        expected = eager_maps(twin, inputs)
        assert torch.equal(out, twin(**inputs).last_hidden_state)
    dtypes = {want.dtype for want in expected}
    assert dtypes == ({torch.bfloat16} if name == "gpt2" else {torch.float32})
    for amap, want in zip(cap.maps, expected, strict=True):
        assert amap.info.dtype == str(want.dtype).removeprefix("torch.")
        assert torch.equal(amap.pattern, want.float())
    assert _worst_row(cap.maps) <= row_sum_tolerance(dtypes.pop())


# ------------------------------------------------------------------- float16 overflow
def _fp16_bert():
    model = build("bert").to(torch.float16)
    return model, batch("bert", (9, 5))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda layer, p: p * 1e6, r"returned NaN or inf \(the model computes in float16"),
    (lambda layer, p: p.float() * 1e6, r"returned values that overflow the model's float16 "
                                        r"\(largest 9"),
], ids=["in-float16", "in-float32"])
def test_float16_edit_that_overflows_is_an_input_error(edit, message):
    model, inputs = _fp16_bert()
    with pytest.raises(ap.InputError, match=r"edit at encoder\.layer\.0\.attention\.self " +
                       message), torch.no_grad(), ap.capture(model, edit=edit):
        model(**inputs)
    assert implementations(model) == {"sdpa"}
    assert torch.isfinite(hidden(model, inputs)).all()


def test_float16_edit_whose_product_with_the_values_overflows():
    """Weights of 6e4 fit float16, but weights × values do not: an error at that layer, not
    an inf that turns into NaN in the next one (the old code returned NaN outputs)."""
    model, inputs = _fp16_bert()
    with pytest.raises(ap.InputError, match=r"encoder\.layer\.0\.attention\.self overflow "
                       r"the model's float16 when applied to the values"), \
            torch.no_grad(), ap.capture(model, layers=[0],
                                        edit=lambda layer, p: torch.full_like(p, 6e4)):
        model(**inputs)
    assert implementations(model) == {"sdpa"}


def test_float16_edit_on_hook_points_overflow():
    model, tok = build_reference("transformer")
    track(model.half())
    with pytest.raises(ap.InputError, match="overflow the model's float16"), \
            torch.no_grad(), ap.capture(model, edit=lambda layer, p: p.float() * 1e6):
        model(**tok(["the cat sat"]))
