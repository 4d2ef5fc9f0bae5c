"""Keys chosen per query by a model's indexer (DeepSeek-V3.2's sparse attention, GLM-DSA,
HY-V4, dots3 ...): applied as a mask before any attention function runs.

These models mask the keys their indexer did not pick themselves only when their attention
implementation is ``"eager"`` or ``"sdpa"``; under any other name (the capture's
``attnprobe_sdpa``) they hand the picks to the attention function as ``indices`` ``[batch,
query, top_k]`` for a sparse kernel to read. attnprobe's function delegates to dense eager /
SDPA, so it folds the picks into the mask exactly as the model's own eager path does (keys not
picked get the dtype's minimum on a float mask, ``False`` on a boolean one). Without this the
captured layers would attend to every key.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["fold_indices"]


def fold_indices(attention_mask: torch.Tensor | None, key: torch.Tensor,
                 kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``attention_mask`` (``[batch, 1, query, key]`` or ``None``) with the keys outside
    ``kwargs["indices"]`` (``[batch, query, top_k]``, a ``-1`` pick is none) masked;
    ``indices`` is removed from ``kwargs``. Unchanged when there are no picks."""
    picks = kwargs.pop("indices", None)
    if picks is None:
        return attention_mask
    n_keys = key.shape[-2]
    batch, n_queries = picks.shape[0], picks.shape[1]
    slot = torch.where(picks >= 0, picks.long(), n_keys)  # the extra slot takes non-picks
    picked = torch.zeros(batch, n_queries, n_keys + 1, dtype=torch.bool, device=picks.device)
    picked = picked.scatter(-1, slot, True)[..., :n_keys].unsqueeze(1)  # [batch, 1, q, k]
    if attention_mask is None:
        attention_mask = torch.zeros(picked.shape, dtype=key.dtype, device=key.device)
    if attention_mask.dtype == torch.bool:
        return attention_mask & picked.to(attention_mask.device)
    return attention_mask.masked_fill(~picked.to(attention_mask.device),
                                      torch.finfo(attention_mask.dtype).min)
