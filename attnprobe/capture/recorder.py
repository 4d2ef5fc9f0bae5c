"""The core every capture seam shares: which sites and heads are in scope, the forward calls,
and dispatch of each block of weights to the capture's parts.

A seam (HF attention function, forward hooks on module paths) hands the recorder each
layer's post-softmax weights as ``[batch, head, query, key]`` blocks. The recorder applies the
edit parts, then gives the block to every part (:mod:`attnprobe.capture.parts`); what the parts
stored becomes maps in :mod:`attnprobe.capture.assemble`. One recorder per capture context:
nothing here outlives it, and nothing is stored on the model.

A recorder only takes the forwards run in the thread (or asyncio task) that opened its context
(:meth:`Recorder.opened`, a ``ContextVar``): hooks and the attention function are shared by
every caller of the model, so captures of one model in several threads each see only their own
forwards.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from attnprobe.capture.calls import ForwardCall, Growing, Side, StopForward
from attnprobe.capture.parts import TENSORS, Part, Rows
from attnprobe.capture.runs import Run
from attnprobe.capture.sites import Site
from attnprobe.capture.steps import fold_steps
from attnprobe.core.reducers import Tally
from attnprobe.core.scope import Scope
from attnprobe.errors import (
    AttentionUnavailableError,
    EditNotAppliedError,
    HookNotFiredError,
    InputError,
)

__all__ = ["Recorder", "open_recorders"]

# The recorders whose capture contexts are open in this thread / task, outermost first.
_OPEN: ContextVar[tuple[Recorder, ...]] = ContextVar("attnprobe_open_recorders", default=())


def open_recorders() -> tuple[Recorder, ...]:
    """The recorders of the capture contexts open in the calling thread, outermost first."""
    return _OPEN.get()


def _append_rows(earlier: torch.Tensor | None, rows: torch.Tensor, site: Site) -> torch.Tensor:
    """Rows of a site that ran again in the same forward.

    A step-by-step decoder (one query row per step over the same keys) gets its rows appended
    along the query axis; anything else (e.g. one layer shared across depths) is ambiguous.
    """
    if earlier is None:
        return rows
    if rows.shape[2] != 1 or earlier.shape[:2] != rows.shape[:2] \
            or earlier.shape[3] != rows.shape[3]:
        raise InputError(f"{site.path} ran more than once in one forward with shapes "
                         f"{tuple(earlier.shape)} and {tuple(rows.shape)}; capture one call "
                         "per forward")
    return torch.cat([earlier, rows], dim=2)


def _rows_moved(before: torch.Tensor | None, now: torch.Tensor | None, fed: int) -> bool:
    """Whether the cached rows ``now`` ``[batch, cached]`` (:func:`~attnprobe.capture.steps.
    cache_rows`) do not continue ``before``, the rows one step earlier, which then fed ``fed``
    tokens: beam search reorders them. A sliding-window cache drops its oldest entries, so
    the rows are compared on the tokens both hold."""
    if before is None or now is None:
        return False
    if now.shape[0] != before.shape[0]:
        return True
    dropped = before.shape[1] + fed - now.shape[1]
    if not 0 <= dropped < before.shape[1]:
        return False  # not one step of this cache: nothing to compare
    return not torch.equal(now[:, :before.shape[1] - dropped], before[:, dropped:])


class Recorder:
    """Per-context state of one capture (never stored on the model)."""

    def __init__(self, scope: Scope, parts: Sequence[Part]) -> None:
        self.scope = scope
        self.parts = list(parts)
        # tensor name (parts.TENSORS) -> the parts that rewrite it, then those that read it
        # (so readers see what the forward computes with)
        self.takers = {name: sorted((p for p in self.parts if name in p.tensors),
                                    key=lambda p: not p.rewrites) for name in TENSORS}
        self.knockouts = [p for p in self.parts if type(p).blocked is not Part.blocked]
        self.changes_forward = bool(self.knockouts) or any(p.rewrites for p in self.parts)
        self._needs_whole = any(p.whole_rows for p in self.parts)  # asked at every call
        self.query_block = min((p.query_block for p in self.parts if p.query_block),
                               default=None)
        # stop_early: raise StopForward once the current forward has read all of these (in
        # whatever order it runs them)
        self.stop_at: frozenset[tuple[str, str, int]] = frozenset()  # Site.key of each
        self.read_now: set[tuple[str, str, int]] = set()  # keys whose every row was read
        self.tally = Tally()
        self.calls: list[ForwardCall] = []
        self._merged: list[ForwardCall] | None = None  # calls with decoding steps folded in
        self._heads: dict[tuple[Site, int], tuple[int, ...]] = {}
        # per site, facts of its module that stay fixed during a capture (e.g. the dtype
        # of its parameters), read once rather than at every decoding step
        self.site_facts: dict[tuple[Site, str], object] = {}
        # KV-cache decoding: the ids and masks of every step so far, per side
        self._grow_ids: dict[Side, Growing] = {}
        self._grow_valid: dict[Side, Growing] = {}
        self._cache_rows: torch.Tensor | None = None  # steps.cache_rows of the last call
        self.fired: dict[Site, None] = {}  # in the order they first fired
        self.edit_changes: dict[Site, float] = {}
        self.knocked_out = 0  # edges knockouts blocked that a row could see
        self.kept_heads: dict[Site, tuple[int, ...]] = {}
        self.layer_counts: dict[tuple[str, str], int] = {}
        self.n_heads = 0  # heads of the model, seen on the first captured tensor
        self.n_layers = 0  # most layers of any stack, known before the forward
        self.dtypes: set[torch.dtype] = set()  # dtypes the weights were computed in
        # module -> its site, for seams that find sites by module (the HF attention function)
        self.site_of: Callable[[nn.Module], Site | None] | None = None
        self.active: dict[int, Run] = {}  # id(module) -> the run of it now in progress
        self.readers: dict[int, object] = {}  # id(module) -> module seam's reader in its run
        self.ran: set[Site] = set()  # sites (as scanned) whose module ran
        # sites were found by scanning the model (not named by the caller): a model with
        # several towers (speech and text encoders) runs only some of them in a forward
        self.found_sites = False
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

    # ------------------------------------------------------------ selection
    @property
    def needs_weights(self) -> bool:
        """Whether any part takes weights (with none, scoped layers keep their fast path)."""
        return bool(self.parts)

    @property
    def needs_whole(self) -> bool:
        """Whether a seam must hand over all query rows at once (no row blocks)."""
        return self._needs_whole

    def wants(self, site: Site) -> bool:
        """Whether ``site``'s layer holds a head of the scope."""
        return self.scope.wants_layer(site.layer)

    def head_index(self, n_heads: int, site: Site) -> tuple[int, ...]:
        """The heads kept at ``site``: the scope's heads over the scoped layers of its stack
        (one grid per stack, so layers stack into one array). Memoised: a decoding step
        asks again for every layer."""
        key = (site, n_heads)
        heads = self._heads.get(key)
        if heads is None:
            heads = self._heads[key] = self._head_index(n_heads, site)
        return heads

    def _head_index(self, n_heads: int, site: Site) -> tuple[int, ...]:
        count = self.layer_counts.get((site.stack, site.kind))
        if count is None:  # a stack found during the forward: the same cover for each layer
            named = (layer for layer, _ in self.scope.terms if layer is not None)
            count = max(named, default=0) + 1
        return self.scope.head_cover(self.scope.layers_in(max(count, site.layer + 1)), n_heads)

    def check_layers(self, counts: dict[tuple[str, str], int]) -> None:
        """Raise before any forward when a scoped layer exists in no stack."""
        self.layer_counts = dict(counts)
        self.n_layers = max(counts.values(), default=0)
        layers = self.scope.layers
        if layers is None or not counts:
            return
        bad = [layer for layer in layers if layer >= self.n_layers]
        if bad:
            bad = bad[:5] + (["..."] if len(bad) > 5 else [])
            stacks = ", ".join(f"{s or 'model'} ({k}): 0..{n - 1}" for (s, k), n in counts.items())
            raise InputError(f"layers {bad} out of range; layers are {stacks}")

    # -------------------------------------------------------------- calls
    def begin_call(self, ids: dict[Side, torch.Tensor | None],
                   valid: dict[Side, torch.Tensor | None],
                   cached: dict[Side, int] | None = None,
                   cache_rows: torch.Tensor | None = None) -> None:
        """Note one forward's inputs ``[batch, seq]`` per side.

        A KV-cache step (the call feeds new tokens after those of the previous call: its mask
        covers both, or its cache holds ``cached[side]`` tokens, as many as the previous call
        saw) continues the previous call: its ids and mask then cover every token so far,
        kept in one growing buffer per side (:class:`~attnprobe.capture.calls.Growing`).
        """
        for mask in valid.values():
            if mask is not None and mask.ndim == 2 and not mask.any(-1).all():
                empty = (~mask.any(-1)).nonzero().flatten().tolist()
                raise InputError(f"examples {empty} have no real tokens: every query row is "
                                 "fully masked")
        fresh = {side: t.shape[-1] for side, t in ids.items() if t is not None}
        cached = cached or {}
        previous = self.calls[-1] if self.calls else None
        continues = False
        for side, current in ids.items():
            past = previous.ids.get(side) if previous is not None else None
            if current is None or past is None or past.shape[0] != current.shape[0]:
                continue
            mask, known, seen = valid.get(side), cached.get(side), past.shape[1]
            if mask is None and known is None:  # nothing says the model had a cache
                continue
            if (mask is not None and seen + current.shape[1] != mask.shape[1]) \
                    or (known is not None and known != seen):
                continue
            continues = True
            ids[side] = self._grown(self._grow_ids, side, past).extend(current)
            if mask is not None:
                before = previous.valid.get(side)
                if before is not None and before.shape == (mask.shape[0], seen):
                    valid[side] = self._grown(self._grow_valid, side, before).extend(
                        mask[:, seen:])
        before, self._cache_rows = self._cache_rows, cache_rows
        fed = max(previous.fresh.values(), default=0) if previous is not None else 0
        reordered = continues and _rows_moved(before, cache_rows, fed)
        self.calls.append(ForwardCall(ids=ids, valid=valid, fresh=fresh, continues=continues,
                                      reordered=reordered))
        self.read_now = set()

    @staticmethod
    def _grown(buffers: dict[Side, Growing], side: Side, past: torch.Tensor) -> Growing:
        """The growing buffer whose latest view is ``past`` (a new one for a new sequence)."""
        buffer = buffers.get(side)
        if buffer is None or not buffer.matches(past):
            buffer = buffers[side] = Growing(past)
        return buffer

    @property
    def current(self) -> ForwardCall:
        if not self.calls:  # a seam fired without the root pre-hook (e.g. a submodule was called)
            self.calls.append(ForwardCall(ids={}, valid={}))
        return self.calls[-1]

    # --------------------------------------------------------------- runs
    def start_run(self, module: nn.Module, base: Site) -> Run:
        """A run of ``module`` (whose site is ``base``) begins in the current forward (the
        module seam's hooks mark them)."""
        call = self.current
        run = call.runs.start(base, call.module_runs.get(id(module)))
        self.active[id(module)] = call.module_runs[id(module)] = run
        return run

    def end_run(self, module: nn.Module) -> None:
        self.active.pop(id(module), None)

    def next_site(self, module: nn.Module, base: Site, query: torch.Tensor | None = None
                  ) -> Site:
        """The site of the attention ``module`` (whose site is ``base``) computes now
        (:mod:`attnprobe.capture.runs`): the next computation of its run in progress (the
        module seam marks runs with hooks), or, for the attention function, a new run unless
        the module's last call in this forward passed this very ``query`` tensor (two
        softmaxes of one run, as differential attention makes; a query tensor that has been
        freed since cannot be this one, whatever its address)."""
        key = id(module)
        run = self.active.get(key)
        if run is not None:
            return run.next_site()
        call = self.calls[-1] if self.calls else self.current
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

    def query_valid(self, site: Site, batch: int, q_len: int) -> torch.Tensor:
        return self.current.valid_mask(site.side, batch, q_len)

    def store(self, what: str, site: Site, rows: torch.Tensor) -> None:
        """Keep ``rows`` of ``site`` in the current call (``"patterns"`` or ``"scores"``)."""
        kept = getattr(self.current, what)
        kept[site] = _append_rows(kept.get(site), rows, site)

    # ------------------------------------------------------------ consume
    def takes(self, name: str) -> bool:
        """Whether a part reads or rewrites tensor ``name`` (:data:`~attnprobe.capture.parts.
        TENSORS`), so that the seam hands it over."""
        return bool(self.takers[name])

    def rewrites(self, name: str) -> bool:
        """Whether a part may replace tensor ``name``."""
        return any(p.rewrites for p in self.takers[name])

    def tensor(self, site: Site, name: str, tensor: torch.Tensor, n_heads: int) -> torch.Tensor:
        """Hand tensor ``name`` of ``site`` (a layer of ``n_heads`` query heads) to the parts
        that take it; the tensor as the rewriting parts left it (checked by them)."""
        for part in self.takers[name]:
            replaced = part.on_tensor(self, site, name, tensor, n_heads)
            if part.rewrites and replaced is not None:
                tensor = replaced
        return tensor

    def blocked(self, site: Site, shape: torch.Size,
                allowed: torch.Tensor | None) -> torch.Tensor | None:
        """``[batch, head, query, key]`` bool: the edges the knockouts block at ``site``
        (None: none); ``allowed`` (broadcastable, or None for all) is what the model's own
        mask lets each row see. A real row left with no key is an error."""
        masks = [m for part in self.knockouts if (m := part.blocked(self, site, shape))
                 is not None]
        if not masks:
            return None
        blocked = masks[0]
        for mask in masks[1:]:
            blocked = blocked | mask
        seen = torch.ones(shape, dtype=torch.bool, device=blocked.device) if allowed is None \
            else torch.broadcast_to(allowed.to(blocked.device), shape)
        self.knocked_out += int((blocked & seen).sum())
        left = (seen & ~blocked).any(-1)  # [batch, head, query]
        real = self.query_valid(site, shape[0], shape[2]).to(left.device)[:, None, :]
        if not bool((left | ~real | ~seen.any(-1)).all()):
            b, h, q = (~left & real & seen.any(-1)).nonzero()[0].tolist()
            raise InputError(f"the knockout at {site.path} blocks every key query {q} of "
                             f"example {b} may read (head {h}); a row needs a key left")
        return blocked

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
        for part in self.parts:
            part.on_rows(self, rows)
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

    def sequences(self) -> list[ForwardCall]:
        """The forward calls, each run of KV-cache decoding steps folded into one call per
        sequence (:func:`~attnprobe.capture.steps.fold_steps`; computed once)."""
        if self._merged is None:
            self._merged = fold_steps(self.calls)
        return self._merged
