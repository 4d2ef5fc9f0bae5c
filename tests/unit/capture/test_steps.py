"""KV-cache decoding steps: recognised by the recorder, folded into one call per sequence
(``attnprobe.capture.steps``), with ids and masks kept in one growing buffer."""

from __future__ import annotations

import torch

from attnprobe.capture.calls import ForwardCall, Growing
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.sites import Site
from attnprobe.capture.steps import fold_steps
from attnprobe.core.scope import Scope

SELF = Site(path="layers.0.attn", stack="layers", kind="self", layer=0)
CROSS = Site(path="layers.0.cross", stack="layers", kind="cross", layer=0, side="decoder")


def _call(ids, patterns, *, continues, valid=None):
    ids = torch.tensor(ids)
    return ForwardCall(ids={"main": ids}, valid={"main": valid},
                       fresh={"main": ids.shape[1]}, continues=continues,
                       patterns=patterns)


def _rows(q, k, start):
    """``[1, 2, q, k]`` with distinct values (``start``, ``start + 1`` ...)."""
    return torch.arange(start, start + 2 * q * k, dtype=torch.float32).reshape(1, 2, q, k)


def test_a_prompt_and_two_steps_become_one_square_call():
    prompt, step1, step2 = _rows(3, 3, 0), _rows(1, 4, 100), _rows(1, 5, 200)
    calls = [_call([[5, 6, 7]], {SELF: prompt}, continues=False),
             _call([[5, 6, 7, 8]], {SELF: step1}, continues=True),
             _call([[5, 6, 7, 8, 9]], {SELF: step2}, continues=True)]
    (folded,) = fold_steps(calls)
    out = folded.patterns[SELF]
    assert out.shape == (1, 2, 5, 5)
    assert torch.equal(out[:, :, :3, :3], prompt) and torch.equal(out[:, :, 3:4, :4], step1)
    assert torch.equal(out[:, :, 4:5, :], step2)
    assert out[:, :, :3, 3:].abs().sum() == 0 and out[:, :, 3, 4].abs().sum() == 0
    assert folded.ids["main"].tolist() == [[5, 6, 7, 8, 9]]
    assert folded.prompt_lengths["main"].tolist() == [3]


def test_a_sliding_window_step_holds_the_last_keys():
    prompt, step = _rows(3, 3, 0), _rows(1, 2, 50)  # the cache kept only the last 2 keys
    calls = [_call([[5, 6, 7]], {SELF: prompt}, continues=False),
             _call([[5, 6, 7, 8]], {SELF: step}, continues=True)]
    out = fold_steps(calls)[0].patterns[SELF]
    assert torch.equal(out[:, :, 3, 2:], step[:, :, 0])
    assert out[:, :, 3, :2].abs().sum() == 0


def test_cross_attention_steps_keep_their_keys():
    calls = [ForwardCall(ids={"decoder": torch.tensor([[1]])}, valid={}, continues=False,
                         patterns={CROSS: _rows(1, 4, 0)}),
             ForwardCall(ids={"decoder": torch.tensor([[1, 9]])}, valid={}, continues=True,
                         patterns={CROSS: _rows(1, 4, 10)})]
    out = fold_steps(calls)[0].patterns[CROSS]
    assert out.shape == (1, 2, 2, 4) and torch.equal(out[:, :, 1:], _rows(1, 4, 10))


def test_calls_that_do_not_line_up_are_left_alone():
    alone = _call([[5, 6]], {SELF: _rows(2, 2, 0)}, continues=False)
    # more keys than tokens so far: not a continuation of this prompt
    odd = _call([[5, 6, 7]], {SELF: _rows(1, 6, 0)}, continues=True)
    assert fold_steps([alone, odd]) == [alone, odd]
    fresh = _call([[5, 6]], {SELF: _rows(2, 2, 0)}, continues=False)
    assert fold_steps([alone, fresh]) == [alone, fresh]


def test_growing_buffer_hands_out_views_and_doubles():
    first = torch.tensor([[1, 2]])
    buffer = Growing(first)
    assert buffer.matches(first)
    views = [buffer.extend(torch.tensor([[i]])) for i in range(3, 20)]
    assert views[-1].tolist() == [list(range(1, 20))]
    assert views[0].tolist() == [[1, 2, 3]]  # earlier views still read their prefix
    assert buffer.buffer.shape[1] < 2 * 19 + 2  # capacity doubles, it does not grow per step
    assert buffer.matches(views[-1]) and not buffer.matches(views[-2])


def test_recorder_recognises_a_cache_step_by_mask_or_cache_length():
    recorder = Recorder(Scope(), [])
    ids, mask = torch.tensor([[5, 6, 7]]), torch.tensor([[True, True, True]])
    recorder.begin_call({"main": ids}, {"main": mask})
    recorder.begin_call({"main": torch.tensor([[8]])},
                        {"main": torch.tensor([[True] * 4])})
    step = recorder.calls[-1]
    assert step.continues and step.ids["main"].tolist() == [[5, 6, 7, 8]]
    recorder.begin_call({"main": torch.tensor([[9]])}, {"main": None}, cached={"main": 4})
    assert recorder.calls[-1].continues
    assert recorder.calls[-1].ids["main"].tolist() == [[5, 6, 7, 8, 9]]
    # an empty cache, or a length that does not match: a new sequence
    recorder.begin_call({"main": torch.tensor([[1, 2]])}, {"main": None}, cached={"main": 0})
    recorder.begin_call({"main": torch.tensor([[3]])}, {"main": None}, cached={"main": 7})
    assert [c.continues for c in recorder.calls] == [False, True, True, False, False]
