"""capture() as a small core plus parts: each part names the seams that serve it, a wrong
combination fails before any forward, the parts form equals the keyword form, and a scope
that is not a grid keeps the smallest grid on the maps while edits touch only its heads."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.capture import Edit, EditOutput, Keep, Live, Part, Reduce, Scores, Values
from attnprobe.capture.parts import SEAMS
from attnprobe.heads import default_reducers
from attnprobe.models import build_reference
from tests.conftest import track
from tests.integration.hf_models import (
    FAMILIES,
    HEAD_DIM,
    build,
    build_pair,
    implementations,
)
from tests.unit.capture.test_hooks import TinyLens
from tests.unit.capture.tiny import batch, eager_attentions, eager_maps, hidden, registrations

EVERY = set(SEAMS)
SERVED = {Keep: EVERY, Reduce: EVERY, Edit: EVERY, Live: EVERY,
          EditOutput: {"hf", "hook_points", "paths"}, Values: {"hf"},
          Scores: {"modules", "hook_points", "paths"}}


def test_every_part_declares_its_seams():
    assert set(SEAMS) == {"hf", "modules", "hook_points", "paths"}
    for part, seams in SERVED.items():
        assert issubclass(part, Part)
        assert set(part.seams) == seams, part.__name__


@pytest.fixture
def ref():
    model, tok = build_reference("transformer")
    return track(model), tok


class Counter:
    """A forward pre-hook on the model's root that counts forwards (proves none ran)."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.calls += 1

    def remove(self):
        self.handle.remove()


def _refused(model, inputs, match, **kwargs):
    counter = Counter(model)
    entered = []
    try:
        with pytest.raises(ap.InputError, match=match), ap.capture(model, **kwargs):
            entered.append(True)
            model(**inputs)
    finally:
        counter.remove()
    assert counter.calls == 0 and not entered


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(values=True), r"values works through transformers' attention interface.*through "
                        r"hook points"),
    (dict(parts=[Keep(), Values()]), "values works through"),
])
def test_hf_only_parts_are_refused_on_hook_points_before_any_forward(ref, kwargs, match):
    model, tok = ref
    _refused(model, tok(["the cat sat"]), match, **kwargs)


def test_scores_are_refused_on_an_hf_model_before_any_forward():
    model = build("bert")
    _refused(model, batch("bert"), r"scores works through .*hook points .* or module paths.*"
                                   r"through transformers' attention interface", scores=True)
    assert implementations(model) == {"sdpa"} and registrations() == set()


def test_values_are_refused_on_module_paths():
    model = track(TinyLens())
    counter = Counter(model)
    try:
        with pytest.raises(ap.InputError, match="through module paths"), \
                ap.capture(model, paths=["blocks.0.attn.hook_pattern"], values=True):
            model(torch.randint(0, 20, (1, 4)))
    finally:
        counter.remove()
    assert counter.calls == 0


@pytest.mark.parametrize("name", ("bert", "t5"))
def test_parts_form_equals_keyword_form(name):
    model = build(name)
    inputs = batch(name, (9, 5))
    if FAMILIES[name].encdec:
        inputs.update(decoder_input_ids=inputs["input_ids"],
                      decoder_attention_mask=inputs["attention_mask"])
    reducers = default_reducers()
    with torch.no_grad(), ap.capture(model, parts=[Keep(), Reduce(reducers)]) as parts:
        model(**inputs)
    with torch.no_grad(), ap.capture(model, reducers=reducers) as flags:
        model(**inputs)
    assert len(parts.maps) == len(flags.maps) > 0
    for a, b in zip(parts.maps, flags.maps, strict=True):
        assert (a.stack, a.kind, a.layers, a.heads) == (b.stack, b.kind, b.layers, b.heads)
        assert torch.equal(a.pattern, b.pattern)
    pd.testing.assert_frame_equal(parts.stats, flags.stats)
    assert len(parts.stats) > 0


def test_reduce_with_query_block_streams_blocks_of_rows():
    model, _ = build_pair("gpt2")
    inputs = batch("gpt2", (9, 5))
    blocks = []

    class Rows:  # a reducer that notes the block sizes it is fed
        name = "rows"

        def __call__(self, block):
            blocks.append(block.pattern.shape[2])
            return {"rows": block.masked_row_sum(torch.ones_like(block.pattern[..., 0]))}

    with torch.no_grad(), ap.capture(model, parts=[Reduce([Rows()], query_block=4)]) as cap:
        model(**inputs)
    assert blocks == [4, 4, 1] * 2  # 9 query rows, two layers
    rows = cap.stats.query("statistic == 'rows'")
    assert set(rows["sum"]) == {14.0}  # 9 + 5 real query rows per head
    blocks.clear()
    with torch.no_grad(), ap.capture(model, parts=[Keep(), Reduce([Rows()], 4)]):
        model(**inputs)
    assert blocks == [9, 9]  # Keep needs whole rows: one block per layer


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(parts=[Keep()], keep=False), r"parts=\[\.\.\.\] or the keyword flags \(keep\)"),
    (dict(parts=[Keep()], keep=True), r"flags \(keep\)"),
    (dict(parts=[Keep()], reducers=default_reducers()), r"flags \(reducers\)"),
    (dict(parts=[Keep()], edit=lambda layer, p: p), r"flags \(edit\)"),
    (dict(parts=[Keep(), Keep()]), "keep given twice"),
    (dict(parts=[Reduce(), Reduce()]), "reducers given twice"),
    (dict(parts=[Scores()]), "scores needs the keep part"),
    (dict(parts=Keep()), "a list of capture parts"),
    (dict(parts=["keep"]), "got str"),
    (dict(query_block=4), "query_block applies to streaming reducers"),
])
def test_wrong_parts_are_refused_before_the_context(ref, kwargs, match):
    model, tok = ref
    _refused(model, tok(["the cat"]), match, **kwargs)


def test_parts_check_their_own_arguments():
    with pytest.raises(ap.InputError, match="at least one reducer"):
        Reduce([])
    with pytest.raises(ap.InputError, match="query_block must be a positive integer"):
        Reduce(query_block=0)
    with pytest.raises(ap.InputError, match=r"edit needs a function fn\(layer, tensor\)"):
        Edit(None)
    assert Reduce().reducers == tuple(default_reducers())


# ---------------------------------------------------------------- a scope that is no grid
SCOPE = "heads:0.1,1.0"  # head 1 of layer 0 and head 0 of layer 1


def _zero_every_head(layer, pattern):
    pattern.zero_()
    return pattern


def _zero_head_inputs(head):
    def pre_hook(module, args):
        x = args[0].clone()
        x[..., head * HEAD_DIM:(head + 1) * HEAD_DIM] = 0.0
        return (x, *args[1:])
    return pre_hook


def test_a_scope_that_is_no_grid_keeps_the_smallest_grid_and_edits_only_its_heads():
    model, twin = build_pair("bert")
    inputs = batch("bert", (9, 5))
    with torch.no_grad(), ap.capture(model, SCOPE) as kept:
        model(**inputs)
    for amap, want in zip(kept.maps, eager_maps(twin, inputs), strict=True):
        assert (amap.layers, amap.heads) == ((0, 1), (0, 1))  # the grid holding the scope
        assert torch.equal(amap.pattern, want[:, :2])
    with torch.no_grad(), ap.capture(model, SCOPE, reducers=default_reducers()) as streamed:
        model(**inputs)
    stats = streamed.tally.summary()
    assert sorted(zip(stats["layer"], stats["head"], strict=True)) == [(0, 1), (1, 0)]

    # the edit zeroes every head it is handed; only heads 0.1 and 1.0 may take it
    with torch.no_grad(), ap.capture(model, SCOPE, edit=_zero_every_head) as edited:
        out = model(**inputs).last_hidden_state
    assert set(edited.edits["layer"]) == {0, 1}
    assert (edited.edits["max_abs_change"] > 0).all()
    # independently: the eager twin with those two heads' inputs to the output projection
    # zeroed (what zero weights give) computes the same output
    path = "encoder.layer.{}.attention.output.dense"
    handles = [twin.get_submodule(path.format(layer)).register_forward_pre_hook(
        _zero_head_inputs(head)) for layer, head in ((0, 1), (1, 0))]
    try:
        expected_out = hidden(twin, inputs)
        expected = eager_attentions(twin, inputs)  # weights before the (hooked) ablation
    finally:
        for handle in handles:
            handle.remove()
    mask = inputs["attention_mask"].bool()
    assert (out - expected_out)[mask].abs().max().item() <= 1e-5
    assert (out - hidden(model, inputs))[mask].abs().max().item() > 1e-3
    for b, amap in enumerate(edited.maps):
        real = mask[b]
        want = expected[b][:, :2][:, :, real][..., real].clone()
        want[0, 1] = 0.0
        want[1, 0] = 0.0
        assert (amap.pattern - want).abs().max().item() <= 1e-5
        assert amap.head(0, 0).sum(-1).sub(1).abs().max().item() <= 1e-5  # untouched heads
        assert amap.head(1, 1).sum(-1).sub(1).abs().max().item() <= 1e-5


def test_output_edit_touches_only_the_scoped_heads():
    model = build("bert")
    inputs = batch("bert", (7, 7))  # no padding: layer 0 is rerun by hand without a mask
    seen = {}

    def zero_all(layer, output):  # [batch, head, query, d_head]
        seen[layer] = output.clone()
        return torch.zeros_like(output)

    with torch.no_grad(), ap.capture(model, "head:1.2", keep=False, edit_output=zero_all):
        edited = model(**inputs).last_hidden_state
    # by hand: layer 1's per-head outputs with only head 2 zeroed, through the rest
    heads = seen[1]
    heads[:, 2] = 0.0
    layer = model.encoder.layer[1]
    with torch.no_grad():
        hidden0 = model.encoder.layer[0](model.embeddings(input_ids=inputs["input_ids"]),
                                         attention_mask=None)
        hidden0 = hidden0[0] if isinstance(hidden0, tuple) else hidden0
    assert set(seen) == {1}
    context = heads.transpose(1, 2).reshape(*heads.shape[:1], heads.shape[2], -1)
    with torch.no_grad():
        attended = layer.attention.output(context, hidden0)
        expected = layer.output(layer.intermediate(attended), attended)
    real = inputs["attention_mask"].bool()
    assert (edited - expected)[real].abs().max().item() <= 1e-5
