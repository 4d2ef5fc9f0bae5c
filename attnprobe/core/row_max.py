"""The largest value of each row and where it is, fast on long rows.

``Tensor.max(dim)`` with indices runs several times slower than the reductions without
indices (``amax``); the census needs the argmax of every attention row of a long input.
"""

from __future__ import annotations

import torch

__all__ = ["row_max"]


def row_max(a: torch.Tensor, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``a.max(-1)``: ``(max, argmax)`` ``[...]`` over the last axis of ``a`` ``[..., key]``
    (the first of equal values), in two stages on long rows: the maxima of chunks of
    ``chunk`` keys, then the argmax inside each row's first best chunk.

    Example:
        >>> import torch
        >>> a = torch.zeros(1, 1200)
        >>> a[0, 700] = a[0, 1100] = 1.0  # equal maxima: the first wins
        >>> value, index = row_max(a)
        >>> float(value[0]), int(index[0])
        (1.0, 700)
    """
    *lead, k = a.shape
    body = k - k % chunk
    if body < 2 * chunk:
        return a.max(-1)
    chunks = a[..., :body].unflatten(-1, (body // chunk, chunk))
    value, which = chunks.amax(-1).max(-1)
    inside = torch.gather(chunks, -2, which[..., None, None].expand(*lead, 1, chunk))
    index = which * chunk + inside[..., 0, :].argmax(-1)
    if body < k:  # the keys after the last whole chunk win only when strictly larger
        tail_value, tail_index = a[..., body:].max(-1)
        later = tail_value > value
        value = torch.where(later, tail_value, value)
        index = torch.where(later, tail_index + body, index)
    return value, index
