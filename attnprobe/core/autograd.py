"""Gradients through a model whose parameters are frozen (``requires_grad=False``).

A gradient with respect to an activation (an attention pattern, a head's output) needs the
activation in the autograd graph, which a model with every parameter frozen does not build,
and a caller under ``torch.no_grad()`` builds no graph at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["gradients_reach"]


@contextmanager
def gradients_reach(model: nn.Module) -> Iterator[None]:
    """For the duration of the context, grad mode is on and every parameter of ``model``
    requires grad, so every activation of a forward is in the autograd graph; the frozen ones
    are frozen again on exit, also on error. Take the gradients with ``torch.autograd.grad``:
    no parameter's ``.grad`` is touched."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(True)
        with torch.enable_grad():
            yield
    finally:
        for p in frozen:
            p.requires_grad_(False)
