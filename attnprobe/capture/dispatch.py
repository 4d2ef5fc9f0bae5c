"""Dispatch: what a seam computed, handed to the capture's parts.

The parts (:mod:`attnprobe.capture.parts`) say what they read: blocks of weights
(``on_rows``), tensors of a site (``on_tensor``, of :data:`~attnprobe.capture.parts.TENSORS`;
rewriting parts first, so that readers see what the forward computes with), edges to block
before the softmax (``blocked``). :class:`Dispatch` derives once what the seams must do for
them — whether a tensor is needed at all, whether every query row must arrive at once,
how many rows a block may hold — and hands each piece to the parts that take it, with the
capture (``host``) they store into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnprobe.capture.parts import TENSORS, Host, Part, Rows
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError

__all__ = ["Dispatch"]


class Dispatch:
    """The parts of one capture, and what they ask of the seams (module docstring)."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = list(parts)
        # tensor name (parts.TENSORS) -> the parts that rewrite it, then those that read it
        self.takers = {name: sorted((p for p in self.parts if name in p.tensors),
                                    key=lambda p: not p.rewrites) for name in TENSORS}
        self.knockouts = [p for p in self.parts if type(p).blocked is not Part.blocked]
        self.changes_forward = bool(self.knockouts) or any(p.rewrites for p in self.parts)
        self.needs_whole = any(p.whole_rows for p in self.parts)  # no row blocks
        self.query_block = min((p.query_block for p in self.parts if p.query_block),
                               default=None)
        self.knocked_out = 0  # edges knockouts blocked that a row could see

    def takes(self, name: str) -> bool:
        """Whether a part reads or rewrites tensor ``name``, so that the seam hands it over."""
        return bool(self.takers[name])

    def rewrites(self, name: str) -> bool:
        """Whether a part may replace tensor ``name``."""
        return any(p.rewrites for p in self.takers[name])

    def tensor(self, host: Host, site: Site, name: str, tensor: torch.Tensor,
               n_heads: int) -> torch.Tensor:
        """Hand tensor ``name`` of ``site`` (a layer of ``n_heads`` query heads) to the parts
        that take it; the tensor as the rewriting parts left it (checked by them)."""
        for part in self.takers[name]:
            replaced = part.on_tensor(host, site, name, tensor, n_heads)
            if part.rewrites and replaced is not None:
                tensor = replaced
        return tensor

    def rows(self, host: Host, rows: Rows) -> None:
        """Hand a block of weights to every part."""
        for part in self.parts:
            part.on_rows(host, rows)

    def blocked(self, host: Host, site: Site, shape: torch.Size, allowed: torch.Tensor | None,
                real_rows: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """``[batch, head, query, key]`` bool: the edges the knockouts block at ``site``
        (None: none); ``allowed`` (broadcastable, or None for all) is what the model's own
        mask lets each row see, ``real_rows()`` the ``[batch, query]`` real rows. A real row
        left with no key is an error."""
        masks = [m for part in self.knockouts if (m := part.blocked(host, site, shape))
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
        real = real_rows().to(left.device)[:, None, :]
        if not bool((left | ~real | ~seen.any(-1)).all()):
            b, h, q = (~left & real & seen.any(-1)).nonzero()[0].tolist()
            raise InputError(f"the knockout at {site.path} blocks every key query {q} of "
                             f"example {b} may read (head {h}); a row needs a key left")
        return blocked
