"""How a module's softmax output holds ``[batch, head, query, key]`` attention weights.

The module seam (:mod:`attnprobe.capture.module_seam`) sees each softmax a module computes.
A :class:`Layout` turns that tensor into ``[batch, head, query, key]`` weights (or says it is
not attention over keys) and puts edited weights back. Most modules need
:data:`ROWS_LAST`; families with their own layout are entries of :data:`LAYOUTS` (by module
class name) — a new layout is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnprobe.errors import AttentionUnavailableError, InputError

__all__ = ["BAND", "LAYOUTS", "ROWS_LAST", "Layout", "band_to_full", "full_to_band"]


@dataclass(frozen=True)
class Layout:
    """``read(weights, dim, batch, tokens)``: the ``[batch, head, query, key]`` weights of a
    softmax over ``dim`` (``None``: not attention over keys); ``write(edited, weights, dim,
    batch, tokens)``: edited ``[batch, head, query, key]`` weights in the module's layout.
    ``batch`` and ``tokens`` are the forward's batch size and token count (0 when unknown)."""

    name: str
    read: Callable[[torch.Tensor, int, int, int], torch.Tensor | None]
    write: Callable[[torch.Tensor, torch.Tensor, int, int, int], torch.Tensor]


def _read_rows_last(weights: torch.Tensor, dim: int, batch: int,
                    tokens: int) -> torch.Tensor | None:
    if dim != weights.ndim - 1:
        return None
    if weights.ndim == 4:
        return weights
    if weights.ndim == 3 and batch and weights.shape[0] % batch == 0:  # [batch·head, q, k]
        return weights.view(batch, -1, *weights.shape[1:])
    return None


def _write_rows_last(edited: torch.Tensor, weights: torch.Tensor, dim: int, batch: int,
                     tokens: int) -> torch.Tensor:
    return edited.reshape(weights.shape)


ROWS_LAST = Layout("rows last", _read_rows_last, _write_rows_last)


def band_to_full(band: torch.Tensor) -> torch.Tensor:
    """Sliding-window weights ``[batch, seq, head, 2w+1]`` (column ``c`` of row ``i`` is key
    ``i - w + c``, Longformer's local attention) as ``[batch, head, seq, seq]``; keys outside
    the sequence must carry no weight (they are masked)."""
    batch, seq, heads, width = band.shape
    w = (width - 1) // 2
    keys = torch.arange(seq, device=band.device)[:, None] \
        + torch.arange(width, device=band.device)[None, :]  # [seq, width], shifted by w
    padded = band.new_zeros(batch, heads, seq, seq + 2 * w)
    padded = padded.scatter(-1, keys.expand(batch, heads, seq, width), band.permute(0, 2, 1, 3))
    return padded[..., w:w + seq]


def full_to_band(full: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`band_to_full`: ``[batch, head, seq, seq]`` -> ``[batch, seq, head,
    width]``; weight outside the window cannot be expressed (an error)."""
    batch, heads, seq, _ = full.shape
    w = (width - 1) // 2
    keys = torch.arange(seq, device=full.device)[:, None] \
        + torch.arange(width, device=full.device)[None, :]
    padded = torch.nn.functional.pad(full, (w, w))
    band = padded.gather(-1, keys.expand(batch, heads, seq, width))
    outside = (full.abs().sum(-1) - band.abs().sum(-1)).abs().max() if full.numel() else 0
    if float(outside) > 1e-6 * max(1.0, float(full.abs().sum(-1).max())):
        raise InputError("the edit puts weight on keys outside the sliding window, which this "
                         "model's attention cannot express")
    return band.permute(0, 2, 1, 3)


def _read_band(weights: torch.Tensor, dim: int, batch: int,
               tokens: int) -> torch.Tensor | None:
    if weights.ndim != 4 or dim != 3:
        return None
    if weights.shape[-1] % 2 == 0:  # global keys come first: not a plain sliding window
        raise AttentionUnavailableError(
            "Longformer-style attention with global attention (global_attention_mask) cannot "
            "be captured as one [query, key] map; capture it without global attention")
    full = band_to_full(weights)
    return full[:, :, :tokens, :tokens] if tokens else full


def _write_band(edited: torch.Tensor, weights: torch.Tensor, dim: int, batch: int,
                tokens: int) -> torch.Tensor:
    full = band_to_full(weights)
    n = edited.shape[-1]
    full = torch.cat([torch.cat([edited, full[:, :, :n, n:]], dim=-1), full[:, :, n:]], dim=2)
    return full_to_band(full, weights.shape[-1]).to(weights.dtype)


# Longformer pads its input to a multiple of the window inside the model: the maps are cut
# back to the forward's tokens (the padded keys are masked, their weights exactly 0).
BAND = Layout("sliding-window band", _read_band, _write_band)

LAYOUTS: dict[str, Layout] = {
    "LongformerSelfAttention": BAND,
    "LEDEncoderSelfAttention": BAND,
}
