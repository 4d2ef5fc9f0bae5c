"""Run tracking: which site an attention computation is, within the current forward call.

A seam knows the module that computes attention; the site it records under also says which
run of that module this is (:mod:`attnprobe.capture.runs`): a layer shared across depths, a
looped stack, or a module with two softmaxes (differential attention) computes several sites
in one forward. The module seam marks runs with hooks (:meth:`RunTracker.start_run` /
:meth:`RunTracker.end_run`); the attention function, which has no such hooks, tells runs
apart by the query tensor (:meth:`RunTracker.next_site`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn

from attnprobe.capture.call_tracking import CallTracker
from attnprobe.capture.runs import Run
from attnprobe.capture.sites import Site

__all__ = ["RunTracker"]


class RunTracker:
    """The runs of attention modules in the calls of ``tracker`` (module docstring)."""

    def __init__(self, tracker: CallTracker) -> None:
        self.tracker = tracker
        # module -> its site, for seams that find sites by module (the HF attention function)
        self.site_of: Callable[[nn.Module], Site | None] | None = None
        self.active: dict[int, Run] = {}  # id(module) -> the run of it now in progress
        self.readers: dict[int, object] = {}  # id(module) -> module seam's reader in its run
        self.ran: set[Site] = set()  # sites (as scanned) whose module ran
        # sites were found by scanning the model (not named by the caller): a model with
        # several towers (speech and text encoders) runs only some of them in a forward
        self.found_sites = False

    def start_run(self, module: nn.Module, base: Site) -> Run:
        """A run of ``module`` (whose site is ``base``) begins in the current forward (the
        module seam's hooks mark them)."""
        call = self.tracker.current
        run = call.runs.start(base, call.module_runs.get(id(module)))
        self.active[id(module)] = call.module_runs[id(module)] = run
        return run

    def end_run(self, module: nn.Module) -> None:
        self.active.pop(id(module), None)

    def next_site(self, module: nn.Module, base: Site, query: torch.Tensor | None = None
                  ) -> Site:
        """The site of the attention ``module`` (whose site is ``base``) computes now: the
        next computation of its run in progress (the module seam marks runs with hooks), or,
        for the attention function, a new run unless the module's last call in this forward
        passed this very ``query`` tensor (two softmaxes of one run, as differential
        attention makes; a query tensor that has been freed since cannot be this one,
        whatever its address)."""
        key = id(module)
        run = self.active.get(key)
        if run is not None:
            return run.next_site()
        call = self.tracker.current
        last = call.last_query.get(key)
        if last is None and (base.stack, base.kind) not in call.runs.looped:
            # the module's first attention call in this forward, in a stack that has not
            # looped: its own site (the common case, every layer of every decoding step)
            self.ran.add(base)
            if query is not None:
                call.last_query[key] = (weakref.ref(query), None)
            call.runs.reached(base)
            return base
        if last is not None and query is not None and last[0]() is query:
            if last[1] is None:  # a second softmax of the module's first run
                run = Run(base, parts=1)
                call.last_query[key] = (last[0], run)
                return run.next_site()
            return last[1].next_site()
        previous = None if last is None else (last[1] or Run(base))
        run = call.runs.start(base, previous)
        call.last_query[key] = (None if query is None else weakref.ref(query), run)
        return run.next_site()
