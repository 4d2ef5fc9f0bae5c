"""Call tracking: the forward calls one capture saw, with KV-cache decoding steps joined.

Every forward of the captured model begins a :class:`~attnprobe.capture.calls.ForwardCall`
holding its inputs per side (token ids, real-token masks) and, later, what the parts kept
of it. A KV-cache step (``generate``) feeds only the new tokens: :meth:`CallTracker.begin`
recognises it as the continuation of the previous call and extends that call's ids and
mask in one growing buffer per side, so every step's rows are read against every token so
far; :meth:`CallTracker.sequences` folds the steps of each sequence into one call.
"""

from __future__ import annotations

import torch

from attnprobe.capture.calls import ForwardCall, Growing, Side
from attnprobe.capture.sites import Site
from attnprobe.capture.steps import fold_steps
from attnprobe.errors import InputError

__all__ = ["CallTracker"]


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


class CallTracker:
    """The forward calls of one capture (module docstring); ``calls`` in the order run."""

    def __init__(self) -> None:
        self.calls: list[ForwardCall] = []
        self._merged: list[ForwardCall] | None = None  # calls with decoding steps folded in
        # KV-cache decoding: the ids and masks of every step so far, per side
        self._grow_ids: dict[Side, Growing] = {}
        self._grow_valid: dict[Side, Growing] = {}
        self._cache_rows: torch.Tensor | None = None  # steps.cache_rows of the last call

    def begin(self, ids: dict[Side, torch.Tensor | None],
              valid: dict[Side, torch.Tensor | None], cached: dict[Side, int] | None = None,
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

    @staticmethod
    def _grown(buffers: dict[Side, Growing], side: Side, past: torch.Tensor) -> Growing:
        """The growing buffer whose latest view is ``past`` (a new one for a new sequence)."""
        buffer = buffers.get(side)
        if buffer is None or not buffer.matches(past):
            buffer = buffers[side] = Growing(past)
        return buffer

    @property
    def current(self) -> ForwardCall:
        """The call in progress."""
        if not self.calls:  # a seam fired without the root pre-hook (e.g. a submodule was called)
            self.calls.append(ForwardCall(ids={}, valid={}))
        return self.calls[-1]

    def query_valid(self, site: Site, batch: int, q_len: int) -> torch.Tensor:
        """``[batch, q_len]`` bool: the real query rows of ``site`` in the current call."""
        return self.current.valid_mask(site.side, batch, q_len)

    def store(self, what: str, site: Site, rows: torch.Tensor) -> None:
        """Keep ``rows`` of ``site`` in the current call (``"patterns"`` or ``"scores"``)."""
        kept = getattr(self.current, what)
        kept[site] = _append_rows(kept.get(site), rows, site)

    def sequences(self) -> list[ForwardCall]:
        """The forward calls, each run of KV-cache decoding steps folded into one call per
        sequence (:func:`~attnprobe.capture.steps.fold_steps`; computed once)."""
        if self._merged is None:
            self._merged = fold_steps(self.calls)
        return self._merged
