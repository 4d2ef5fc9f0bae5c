"""Identity modules that name an activation so hooks can read or replace it."""

from __future__ import annotations

import torch
from torch import nn


class HookPoint(nn.Module):
    """Returns its input unchanged; a forward hook on it can read or replace the tensor.

    Reference models pass every interesting tensor through one, e.g.
    ``pattern = self.hook_pattern(pattern)`` right after the softmax, so the tensor is
    addressable by a stable path such as ``blocks.0.attn.hook_pattern``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
