"""One forward call of a captured model (its inputs and what was kept), and the padded
weights it produced; shared by the recorder and the analyses that read whole batches."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnprobe.capture.sites import Site

Side = str  # "main" | "decoder"


@dataclass
class ForwardCall:
    """Inputs of one forward of the captured model and what was kept from it.

    ``ids`` / ``valid``: ``[batch, seq]`` token ids and real-token masks per side
    (``None`` when the model was not given them). ``patterns``: site -> ``[batch, head, q, k]``.
    """

    ids: dict[Side, torch.Tensor | None]
    valid: dict[Side, torch.Tensor | None]
    fresh: dict[Side, int] = field(default_factory=dict)  # tokens new in this call (KV cache)
    patterns: dict[Site, torch.Tensor] = field(default_factory=dict)
    scores: dict[Site, torch.Tensor] = field(default_factory=dict)
    live: dict[Site, torch.Tensor] = field(default_factory=dict)  # in the graph, grads retained
    values: dict[Site, torch.Tensor] = field(default_factory=dict)  # [batch, head, key, d_head]

    def positions_of(self, side: Side, batch: int, length: int) -> tuple[torch.Tensor, bool]:
        """Which of ``length`` positions are real tokens of ``side``: ``[batch, length]`` bool,
        and whether those positions are the side's tokens at all.

        They are when ``length`` is the side's full length (keys, and queries without a cache),
        or the tokens new in this call (queries of a KV-cache step). Any other length — e.g. a
        learned pooling query — is not a token of the input: all rows count, none is named.
        """
        mask = self.valid.get(side)
        ones = torch.ones(batch, length, dtype=torch.bool)
        if mask is None or mask.shape[0] != batch:
            ids = self.ids.get(side)
            return ones, ids is None or ids.shape[-1] == length
        if mask.shape[1] == length:
            return mask, True
        if self.fresh.get(side) == length and mask.shape[1] > length:
            return mask[:, mask.shape[1] - length:], True
        return ones, False

    def valid_mask(self, side: Side, batch: int, length: int) -> torch.Tensor:
        """``[batch, length]`` bool: False on padding (see :meth:`positions_of`)."""
        return self.positions_of(side, batch, length)[0]

    def token_view(self, side: Side, batch: int, length: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Real-token mask, positions among the side's real tokens (counting cached tokens
        of a KV-cache step, -1 on padding) and token ids (``None`` when unknown), each
        ``[batch, length]``."""
        valid, are_tokens = self.positions_of(side, batch, length)
        mask = self.valid.get(side)
        if are_tokens and mask is not None and mask.shape[0] == batch \
                and mask.shape[1] >= length:
            pos = positions(mask)[:, mask.shape[1] - length:]
        else:
            pos = positions(valid)
        ids = self.ids.get(side)
        if not are_tokens or ids is None or ids.shape[0] != batch or ids.shape[1] < length:
            ids = None
        else:
            ids = ids[:, ids.shape[1] - length:]
        return valid, pos, ids


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


def positions(valid: torch.Tensor) -> torch.Tensor:
    """Position of each entry among the real tokens of its row; -1 on padding. ``[batch, seq]``."""
    pos = valid.long().cumsum(-1) - 1
    return torch.where(valid, pos, torch.full_like(pos, -1))
