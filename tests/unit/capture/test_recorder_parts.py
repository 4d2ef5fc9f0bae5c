"""The recorder is composed of call tracking, run tracking (which site a computation is),
site selection and dispatch; each works on its own."""

import pytest
import torch

from attnprobe.capture.call_tracking import CallTracker
from attnprobe.capture.dispatch import Dispatch
from attnprobe.capture.parts import Keep, Reduce
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.run_tracking import RunTracker
from attnprobe.capture.site_selection import SiteSelection
from attnprobe.capture.sites import Site
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError


def _site(layer, stack="blocks"):
    return Site(stack=stack, kind="self", layer=layer, path=f"{stack}.{layer}.attn")


def test_call_tracking_joins_kv_cache_steps():
    tracker = CallTracker()
    first = torch.tensor([[5, 6, 7]])
    tracker.begin({"main": first}, {"main": torch.ones(1, 3, dtype=torch.bool)})
    step = torch.tensor([[8]])
    tracker.begin({"main": step}, {"main": torch.ones(1, 4, dtype=torch.bool)})
    assert len(tracker.calls) == 2
    assert tracker.current.continues
    assert tracker.current.ids["main"].tolist() == [[5, 6, 7, 8]]  # every token so far


def test_call_tracking_refuses_a_fully_masked_example():
    with pytest.raises(InputError, match="no real tokens"):
        CallTracker().begin({"main": torch.tensor([[1, 2]])},
                            {"main": torch.tensor([[True, True], [False, False]])})


def test_run_tracking_gives_each_module_its_site_once_per_forward():
    tracker = CallTracker()
    runs = RunTracker(tracker)
    module, base = torch.nn.Linear(1, 1), _site(0)
    tracker.begin({}, {})
    assert runs.next_site(module, base) == base
    assert runs.ran == {base}


def test_site_selection_keeps_the_scope():
    selection = SiteSelection(Scope.parse("head:1.2"))
    assert not selection.wants(_site(0)) and selection.wants(_site(1))
    assert selection.head_index(4, _site(1)) == (2,)
    with pytest.raises(InputError, match="out of range"):
        selection.check_layers({("blocks", "self"): 1})


def test_dispatch_reads_what_its_parts_need():
    streaming = Dispatch([Reduce(query_block=4)])
    assert not streaming.needs_whole and streaming.query_block == 4
    assert not streaming.takes("pattern") and not streaming.changes_forward
    kept = Dispatch([Keep(), Reduce(query_block=4)])
    assert kept.needs_whole  # Keep needs every row at once


def test_the_recorder_composes_them():
    recorder = Recorder(Scope.parse("layer:0"), [Keep()])
    assert isinstance(recorder.tracker, CallTracker)
    assert isinstance(recorder.runs, RunTracker) and recorder.runs.tracker is recorder.tracker
    assert isinstance(recorder.selection, SiteSelection)
    assert isinstance(recorder.dispatch, Dispatch)
    recorder.begin_call({"main": torch.tensor([[1, 2]])}, {"main": None})
    assert recorder.calls is recorder.tracker.calls and len(recorder.calls) == 1
    assert recorder.wants(_site(0)) and not recorder.wants(_site(1))
