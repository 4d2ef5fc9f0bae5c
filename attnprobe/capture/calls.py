"""One forward call of a captured model (its inputs and what was kept), and the padded
weights it produced; shared by the recorder and the analyses that read whole batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnprobe.capture.runs import Run, Runs
from attnprobe.capture.sites import Site

Side = str  # "main" | "decoder"


@dataclass
class ForwardCall:
    """Inputs of one forward of the captured model and what was kept from it.

    ``ids`` / ``valid``: ``[batch, seq]`` token ids and real-token masks per side
    (``None`` when the model was not given them); in a KV-cache step they cover the cached
    tokens too. ``patterns``: site -> ``[batch, head, q, k]``. ``continues``: the call is a
    KV-cache step of the call before it (a decoding step of ``generate``).
    ``prompt_lengths``: per side, ``[batch]`` real tokens of the first forward of a sequence
    whose decoding steps were folded into this call (:mod:`attnprobe.capture.steps`).
    """

    ids: dict[Side, torch.Tensor | None]
    valid: dict[Side, torch.Tensor | None]
    fresh: dict[Side, int] = field(default_factory=dict)  # tokens new in this call (KV cache)
    continues: bool = False
    reordered: bool = False  # a decoding step whose rows are not those of the step before
    prompt_lengths: dict[Side, torch.Tensor] = field(default_factory=dict)
    patterns: dict[Site, torch.Tensor] = field(default_factory=dict)
    scores: dict[Site, torch.Tensor] = field(default_factory=dict)
    live: dict[Site, torch.Tensor] = field(default_factory=dict)  # in the graph, grads retained
    values: dict[Site, torch.Tensor] = field(default_factory=dict)  # [batch, head, key, d_head]
    # site -> {"q" | "k" | "v" | "z": [batch, head|kv_head, position, d_head]}
    activations: dict[Site, dict[str, torch.Tensor]] = field(default_factory=dict)
    runs: Runs = field(default_factory=Runs)  # which run of which module each site is
    # id(module) -> (weak reference to the query of its last attention call, that run; None
    # for a first run that is the module's own site)
    last_query: dict[int, tuple[Any, Run | None]] = field(default_factory=dict)
    module_runs: dict[int, Run] = field(default_factory=dict)  # id(module) -> its last run
    # (side, batch, length) -> (the side's mask and ids it was read from, its token view):
    # every layer of a forward asks for the same views
    views: dict[tuple[Side, int, int], tuple[Any, Any, tuple]] = field(
        default_factory=dict, repr=False)

    def positions_of(self, side: Side, batch: int, length: int) -> tuple[torch.Tensor, bool]:
        """Which of ``length`` positions are real tokens of ``side``: ``[batch, length]`` bool,
        and whether those positions are the side's tokens at all.

        They are when ``length`` is the side's full length (keys, and queries without a cache),
        or, in a KV-cache step, the last ``length`` tokens (the new tokens on the query side;
        on the key side the most recent keys a sliding-window cache still holds). Any other
        length — e.g. a learned pooling query — is not a token of the input: all rows count,
        none is named.
        """
        mask = self.valid.get(side)
        ones = torch.ones(batch, length, dtype=torch.bool)
        step = self.fresh.get(side) == length or self.continues
        if mask is None or mask.shape[0] != batch:
            ids = self.ids.get(side)
            return ones, ids is None or ids.shape[-1] == length or (
                step and ids.shape[-1] > length)
        if mask.shape[1] == length:
            return mask, True
        if step and mask.shape[1] > length:
            return mask[:, mask.shape[1] - length:], True
        return ones, False

    def valid_mask(self, side: Side, batch: int, length: int) -> torch.Tensor:
        """``[batch, length]`` bool: False on padding (see :meth:`positions_of`)."""
        return self.positions_of(side, batch, length)[0]

    def token_view(self, side: Side, batch: int, length: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Real-token mask, positions among the side's real tokens (counting cached tokens
        of a KV-cache step, -1 on padding) and token ids (``None`` when unknown), each
        ``[batch, length]``; read once per forward (not to be changed in place)."""
        mask, ids = self.valid.get(side), self.ids.get(side)
        known = self.views.get((side, batch, length))
        if known is not None and known[0] is mask and known[1] is ids:
            return known[2]
        view = self._token_view(side, batch, length)
        self.views[(side, batch, length)] = (mask, ids, view)
        return view

    def _token_view(self, side: Side, batch: int, length: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        valid, are_tokens = self.positions_of(side, batch, length)
        mask = self.valid.get(side)
        ids = self.ids.get(side)
        if are_tokens and mask is not None and mask.shape[0] == batch \
                and mask.shape[1] >= length:
            pos = positions(mask)[:, mask.shape[1] - length:]
        elif are_tokens and mask is None and ids is not None and ids.shape[1] > length:
            # a KV-cache step without a mask: the last `length` of the tokens so far
            pos = torch.arange(ids.shape[1] - length, ids.shape[1]).expand(batch, -1)
        else:
            pos = positions(valid)
        if not are_tokens or ids is None or ids.shape[0] != batch or ids.shape[1] < length:
            ids = None
        else:
            ids = ids[:, ids.shape[1] - length:]
        return valid, pos, ids


class Growing:
    """A ``[batch, n]`` tensor that grows along its last axis, with capacity doubling.

    Each decoding step of ``generate`` sees every token so far; the steps' ids and masks are
    views of one buffer (the buffer is copied only when it doubles), so a sequence of ``T``
    steps holds ``O(T)`` numbers, not one full copy per step.
    """

    def __init__(self, first: torch.Tensor) -> None:
        self.buffer = first
        self.length = first.shape[1]

    def matches(self, current: torch.Tensor) -> bool:
        """Whether ``current`` is this buffer's tensor (the view last handed out)."""
        return current.shape == (self.buffer.shape[0], self.length) and (
            current.data_ptr() == self.buffer.data_ptr())

    def extend(self, more: torch.Tensor) -> torch.Tensor:
        """Append ``more`` ``[batch, m]``; the whole tensor so far, as a view."""
        end = self.length + more.shape[1]
        if end > self.buffer.shape[1]:
            grown = self.buffer.new_empty((self.buffer.shape[0], 2 * end))
            grown[:, :self.length] = self.buffer[:, :self.length]
            self.buffer = grown
        self.buffer[:, self.length:end] = more
        self.length = end
        return self.buffer[:, :end]


class StopForward(Exception):
    """Raised inside the forward once the last wanted attention site has been read
    (``capture(stop_early=True)``); the capture context swallows it."""


@dataclass(frozen=True)
class BatchPatterns:
    """The weights one forward produced in one (stack, kind), padding included.

    Shapes: ``pattern`` ``[batch, layer, head, query, key]``; ``query_valid`` / ``key_valid``
    ``[batch, query]`` / ``[batch, key]`` bool; ``query_ids`` / ``key_ids`` the token ids
    (``None`` when unknown). ``layers`` / ``heads`` are the model indices of dims 1 and 2.
    """

    pattern: torch.Tensor
    query_valid: torch.Tensor
    key_valid: torch.Tensor
    query_ids: torch.Tensor | None
    key_ids: torch.Tensor | None
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    stack: str
    kind: str
    learned_sink: bool = False  # rows sum to at most 1: a learned sink took the rest


def positions(valid: torch.Tensor) -> torch.Tensor:
    """Position of each entry among the real tokens of its row; -1 on padding. ``[batch, seq]``."""
    pos = valid.long().cumsum(-1) - 1
    return torch.where(valid, pos, torch.full_like(pos, -1))
