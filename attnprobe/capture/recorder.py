"""The per-context state of one capture, composed of small pieces with one job each.

A seam (HF attention function, forward hooks on module paths) hands the recorder each
layer's post-softmax weights as ``[batch, head, query, key]`` blocks; what the parts stored
becomes maps in :mod:`attnprobe.capture.assemble`. One recorder per capture context: nothing
here outlives it, and nothing is stored on the model. The recorder composes

- **call tracking** (:class:`~attnprobe.capture.call_tracking.CallTracker`): the forward
  calls and their inputs, KV-cache decoding steps joined;
- **run tracking** (:class:`~attnprobe.capture.run_tracking.RunTracker`): which site an
  attention computation is (runs of shared, looped or two-softmax modules);
- **site selection** (:class:`~attnprobe.capture.site_selection.SiteSelection`): which layers
  and heads the scope keeps;
- **dispatch** (:class:`~attnprobe.capture.dispatch.Dispatch`): which parts take what, and
  handing it to them;

and keeps what a capture collects across them (the tally, the sites that fired, the edits'
changes) with the checks at exit (:meth:`Recorder.finish`). Seams and parts call the
recorder; its methods forward to the piece that does the job.

**Thread-local opening.** A recorder only takes the forwards run in the thread (or asyncio
task) that opened its context (:meth:`Recorder.opened`, a ``ContextVar``): hooks and the
attention function are shared by every caller of the model, so captures of one model in
several threads each see only their own forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from attnprobe.capture.call_tracking import CallTracker
from attnprobe.capture.calls import ForwardCall, Side, StopForward
from attnprobe.capture.dispatch import Dispatch
from attnprobe.capture.parts import Part, Rows
from attnprobe.capture.run_tracking import RunTracker
from attnprobe.capture.runs import Run
from attnprobe.capture.site_selection import SiteSelection
from attnprobe.capture.sites import Site
from attnprobe.core.reducers import Tally
from attnprobe.core.scope import Scope
from attnprobe.errors import (
    AttentionUnavailableError,
    EditNotAppliedError,
    HookNotFiredError,
)

__all__ = ["Recorder", "open_recorders"]

# The recorders whose capture contexts are open in this thread / task, outermost first.
_OPEN: ContextVar[tuple[Recorder, ...]] = ContextVar("attnprobe_open_recorders", default=())


def open_recorders() -> tuple[Recorder, ...]:
    """The recorders of the capture contexts open in the calling thread, outermost first."""
    return _OPEN.get()


class Recorder:
    """Per-context state of one capture (module docstring; never stored on the model)."""

    def __init__(self, scope: Scope, parts: Sequence[Part]) -> None:
        self.tracker = CallTracker()
        self.runs = RunTracker(self.tracker)
        self.selection = SiteSelection(scope)
        self.dispatch = Dispatch(parts)
        # stop_early: raise StopForward once the current forward has read all of these (in
        # whatever order it runs them)
        self.stop_at: frozenset[tuple[str, str, int]] = frozenset()  # Site.key of each
        self.read_now: set[tuple[str, str, int]] = set()  # keys whose every row was read
        self.tally = Tally()
        # per site, facts of its module that stay fixed during a capture (e.g. the dtype
        # of its parameters), read once rather than at every decoding step
        self.site_facts: dict[tuple[Site, str], object] = {}
        self.fired: dict[Site, None] = {}  # in the order they first fired
        self.edit_changes: dict[Site, float] = {}
        self.kept_heads: dict[Site, tuple[int, ...]] = {}
        self.n_heads = 0  # heads of the model, seen on the first captured tensor
        self.dtypes: set[torch.dtype] = set()  # dtypes the weights were computed in
        self.learned_sinks: set[Site] = set()  # sites whose rows leave mass on a learned sink

    # ------------------------------------------------------------ opening
    @contextmanager
    def opened(self) -> Iterator[None]:
        """Make this recorder take the forwards of the calling thread while the block runs."""
        _OPEN.set((*_OPEN.get(), self))
        try:
            yield
        finally:  # not reset(token): contexts of one thread may close out of order
            _OPEN.set(tuple(r for r in _OPEN.get() if r is not self))

    @property
    def is_open(self) -> bool:
        """Whether the calling thread runs inside this recorder's context."""
        return any(r is self for r in _OPEN.get())

    # ---------------------------------------------------- site selection
    @property
    def scope(self) -> Scope:
        return self.selection.scope

    @property
    def layer_counts(self) -> dict[tuple[str, str], int]:
        return self.selection.layer_counts

    @property
    def n_layers(self) -> int:
        """Most layers of any stack, known before the forward."""
        return self.selection.n_layers

    def wants(self, site: Site) -> bool:
        """Whether ``site``'s layer holds a head of the scope."""
        return self.selection.wants(site)

    def head_index(self, n_heads: int, site: Site) -> tuple[int, ...]:
        """The heads kept at ``site`` (:meth:`SiteSelection.head_index`)."""
        return self.selection.head_index(n_heads, site)

    def check_layers(self, counts: dict[tuple[str, str], int]) -> None:
        """Raise before any forward when a scoped layer exists in no stack."""
        self.selection.check_layers(counts)

    # ------------------------------------------------------ call tracking
    @property
    def calls(self) -> list[ForwardCall]:
        return self.tracker.calls

    @property
    def current(self) -> ForwardCall:
        return self.tracker.current

    def begin_call(self, ids: dict[Side, torch.Tensor | None],
                   valid: dict[Side, torch.Tensor | None],
                   cached: dict[Side, int] | None = None,
                   cache_rows: torch.Tensor | None = None) -> None:
        """Note one forward's inputs ``[batch, seq]`` per side (:meth:`CallTracker.begin`)."""
        self.tracker.begin(ids, valid, cached, cache_rows)
        self.read_now = set()

    def query_valid(self, site: Site, batch: int, q_len: int) -> torch.Tensor:
        return self.tracker.query_valid(site, batch, q_len)

    def store(self, what: str, site: Site, rows: torch.Tensor) -> None:
        """Keep ``rows`` of ``site`` in the current call (``"patterns"`` or ``"scores"``)."""
        self.tracker.store(what, site, rows)

    def sequences(self) -> list[ForwardCall]:
        """The forward calls, decoding steps folded (:meth:`CallTracker.sequences`)."""
        return self.tracker.sequences()

    # ------------------------------------------------------- run tracking
    @property
    def site_of(self) -> Callable[[nn.Module], Site | None] | None:
        """Module -> its site, for seams that find sites by module (set by the HF seam)."""
        return self.runs.site_of

    @site_of.setter
    def site_of(self, find: Callable[[nn.Module], Site | None] | None) -> None:
        self.runs.site_of = find

    @property
    def found_sites(self) -> bool:
        """Sites were found by scanning the model (not named by the caller)."""
        return self.runs.found_sites

    @found_sites.setter
    def found_sites(self, found: bool) -> None:
        self.runs.found_sites = found

    @property
    def readers(self) -> dict[int, object]:
        return self.runs.readers

    @property
    def ran(self) -> set[Site]:
        return self.runs.ran

    def start_run(self, module: nn.Module, base: Site) -> Run:
        return self.runs.start_run(module, base)

    def end_run(self, module: nn.Module) -> None:
        self.runs.end_run(module)

    def next_site(self, module: nn.Module, base: Site, query: torch.Tensor | None = None
                  ) -> Site:
        """The site ``module`` computes now (:meth:`RunTracker.next_site`)."""
        return self.runs.next_site(module, base, query)

    # ----------------------------------------------------------- dispatch
    @property
    def parts(self) -> list[Part]:
        return self.dispatch.parts

    @property
    def knockouts(self) -> list[Part]:
        return self.dispatch.knockouts

    @property
    def changes_forward(self) -> bool:
        return self.dispatch.changes_forward

    @property
    def query_block(self) -> int | None:
        return self.dispatch.query_block

    @property
    def knocked_out(self) -> int:
        return self.dispatch.knocked_out

    @property
    def needs_weights(self) -> bool:
        """Whether any part takes weights (with none, scoped layers keep their fast path)."""
        return bool(self.dispatch.parts)

    @property
    def needs_whole(self) -> bool:
        """Whether a seam must hand over all query rows at once (no row blocks)."""
        return self.dispatch.needs_whole

    def takes(self, name: str) -> bool:
        return self.dispatch.takes(name)

    def rewrites(self, name: str) -> bool:
        return self.dispatch.rewrites(name)

    def tensor(self, site: Site, name: str, tensor: torch.Tensor, n_heads: int) -> torch.Tensor:
        """Tensor ``name`` of ``site`` through the parts that take it (:meth:`Dispatch.
        tensor`)."""
        return self.dispatch.tensor(self, site, name, tensor, n_heads)

    def blocked(self, site: Site, shape: torch.Size,
                allowed: torch.Tensor | None) -> torch.Tensor | None:
        """The edges the knockouts block at ``site`` (:meth:`Dispatch.blocked`)."""
        return self.dispatch.blocked(self, site, shape, allowed,
                                     lambda: self.query_valid(site, shape[0], shape[2]))

    def consume(self, site: Site, pattern: torch.Tensor, q_start: int = 0,
                q_total: int | None = None, visible: torch.Tensor | None = None,
                k_start: int = 0, k_total: int | None = None) -> None:
        """Take a block of rows ``[batch, head, q_block, key]`` starting at query ``q_start``.

        ``visible`` (``[batch|1, q_block]``): how many keys each row was allowed to attend to,
        from the seam's mask; estimated from the weights when the seam cannot know it.
        ``k_start`` / ``k_total``: a streamed block holding only keys ``k_start ..`` of the
        site's ``k_total`` (those its rows may see).
        """
        self.fired.setdefault(site)
        self.dtypes.add(pattern.dtype)
        n_heads = pattern.shape[1]
        self.n_heads = max(self.n_heads, n_heads)
        heads = self.head_index(n_heads, site)
        self.kept_heads[site] = heads
        kept = pattern if len(heads) == n_heads else pattern[:, list(heads)]
        rows = Rows(site, pattern, kept, heads, q_start, q_total or pattern.shape[2], visible,
                    k_start, k_total or pattern.shape[3])
        self.dispatch.rows(self, rows)
        if self.stop_at and q_start + pattern.shape[2] >= rows.q_total:
            self.read_now.add(site.key)
            if self.stop_at <= self.read_now:
                raise StopForward

    # ------------------------------------------------------------- finish
    def finish(self, wanted_sites: Sequence[Site]) -> None:
        """After a clean exit: every wanted site fired, every edit changed something."""
        if not self.calls:
            raise HookNotFiredError("the model was never called inside the capture context")
        captured = {s.path for s in self.fired}  # a module's runs may be numbered by depth
        missing = [s for s in wanted_sites if s.path not in captured]
        if self.found_sites and self.fired:  # a tower the forward did not take is no error
            took = {(s.stack, s.kind) for s in self.fired}
            missing = [s for s in missing if (s.stack, s.kind) in took or s in self.ran]
        if missing and self.needs_weights:
            silent = [s.path for s in missing if s in self.ran]
            if silent:
                raise AttentionUnavailableError(
                    f"{', '.join(silent)} ran but computed no attention weights attnprobe can "
                    "read (no softmax over keys and no scaled_dot_product_attention call)")
            raise HookNotFiredError(f"attention at {', '.join(s.path for s in missing)} never "
                                    "ran; check the paths/layers or that the model calls these "
                                    "modules")
        if any(p.rewrites for p in self.parts) and not any(
                v > 0 for v in self.edit_changes.values()):
            raise EditNotAppliedError("the edit left every attention pattern unchanged "
                                      f"(layers {sorted({s.layer for s in self.fired})})")
        if self.knockouts and not self.knocked_out:
            raise EditNotAppliedError("the knockout blocked no edge a query could read "
                                      f"(layers {sorted({s.layer for s in self.fired})})")
