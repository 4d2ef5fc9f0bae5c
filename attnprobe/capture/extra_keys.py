"""Keys that are not tokens: entries a layer appends after the token keys.

DeepSeek-V4's compressed attention concatenates, after the ``T`` token keys, one compressed
entry per window of ``r`` padded positions (entry ``w`` summarises positions ``w·r ..
(w+1)·r-1``; ``T // r`` entries). A map of such a layer keeps the real token keys as every
layer does, and of the entries those some real query of the example gives weight to (an
entry no real query sees stands for padding, or for a window the unpadded example would not
have). Entries are named for the example's tokens they summarise (``[compressed 4-7]``), or
``[compressed w: padding]`` when the window holds none (left padding: the compressor does not
read the attention mask, so real queries may attend to it).

Each kind is one entry of :data:`EXTRA_KEYS` (the attention module attribute that holds the
appending part, and how to read its window); a new kind is one entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnprobe.capture.sites import Site

__all__ = ["EXTRA_KEYS", "ExtraKeys", "extra_key_view", "extra_keys_of"]


@dataclass(frozen=True)
class ExtraKeys:
    """A layer's appended keys: ``label`` names them, one per ``window`` padded positions."""

    label: str
    window: int


# attention-module attribute -> (label, window of the module that holds it)
EXTRA_KEYS: dict[str, tuple[str, Callable[[nn.Module], int | None]]] = {
    "compressor": ("compressed", lambda part: getattr(part, "compress_rate", None)),
}


def extra_keys_of(model: nn.Module, sites: Sequence[Site]) -> dict[str, ExtraKeys]:
    """``path -> ExtraKeys`` for the sites whose module appends keys (:data:`EXTRA_KEYS`)."""
    found: dict[str, ExtraKeys] = {}
    for site in sites:
        try:
            module = model.get_submodule(site.path)
        except AttributeError:
            continue
        for attribute, (label, window_of) in EXTRA_KEYS.items():
            part = getattr(module, attribute, None)
            window = window_of(part) if isinstance(part, nn.Module) else None
            if isinstance(window, int) and window > 0:
                found[site.path] = ExtraKeys(label, window)
    return found


def extra_key_view(extra: ExtraKeys, mask: torch.Tensor, rows: torch.Tensor,
                   q_valid: torch.Tensor) -> tuple[torch.Tensor, list[str]] | None:
    """Which of one example's keys the map keeps, and the names of the appended ones.

    ``mask`` ``[T]``: the example's real tokens over the padded batch; ``rows`` ``[layer,
    head, query, T + n]``: its weights; ``q_valid`` ``[query]``: its real query rows. Returns
    ``[T + n]`` bool (real tokens, then the appended entries some real row attends to) and the
    kept entries' names; ``None`` when ``n`` is not the number of windows (a decoding step
    with a cache: the layout is not known).
    """
    n_tokens, n_keys = mask.shape[0], rows.shape[-1]
    n_extra = n_keys - n_tokens
    if n_extra <= 0 or n_extra != n_tokens // extra.window:
        return None
    seen = rows[:, :, q_valid][..., n_tokens:].ne(0).flatten(0, 2).any(0)  # [n_extra]
    position = mask.long().cumsum(0) - 1  # index among the example's real tokens
    names = []
    for w in range(n_extra):
        if not bool(seen[w]):
            continue
        span = slice(w * extra.window, (w + 1) * extra.window)
        real = position[span][mask[span]]
        names.append(f"[{extra.label} {w}: padding]" if not len(real) else
                     f"[{extra.label} {int(real[0])}-{int(real[-1])}]")
    return torch.cat([mask, seen.to(mask.device)]), names
