"""The MLP outputs of a forward per depth: kept, or frozen at kept values (path patching).

Path patching (:mod:`attnprobe.patch.paths`) keeps every MLP's output of the clean and the
corrupted run and freezes them at the base run's in its patched forwards. Two things make
"the MLP of layer ``i``" more than a forward hook on one module:

- **a module at several depths** (a layer list holding one layer twice, looped models): its
  ``k``-th call in a forward is the ``k``-th of the depths it serves, so calls are counted per
  module, from zero at each forward of the model;
- **MLPs that return more than the residual update** (mixture-of-experts MLPs such as
  GPT-OSS's return ``(hidden, router_scores)``): the residual update is the first element;
  the rest passes through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["MlpDepths", "residual_update"]


def residual_update(output: Any) -> torch.Tensor:
    """What an MLP adds to the residual stream ``[batch, seq, d_model]``: its output, or
    the first element of the tuple a mixture-of-experts MLP returns."""
    return output[0] if isinstance(output, tuple) else output


def _with_update(output: Any, update: torch.Tensor) -> Any:
    """``output`` with its residual update replaced by ``update`` (in its dtype)."""
    if isinstance(output, tuple):
        return (update.to(output[0].dtype), *output[1:])
    return update.to(output.dtype)


class MlpDepths:
    """The MLP of each depth (``{depth: module}``, one module possibly at several depths) and
    the hooks that read or replace their outputs per depth (module docstring)."""

    def __init__(self, model: nn.Module, mlps: Mapping[int, nn.Module]) -> None:
        self.model = model
        self.modules: dict[int, nn.Module] = {}
        self.depths: dict[int, list[int]] = {}  # id(module) -> the depths of its calls
        for depth in sorted(mlps):
            module = mlps[depth]
            self.modules.setdefault(id(module), module)
            self.depths.setdefault(id(module), []).append(depth)

    @contextmanager
    def _hooked(self, fn: Callable[[int, Any], Any]) -> Iterator[None]:
        """Within the block, ``fn(depth, output)`` runs on each MLP call (its result, when not
        None, replaces the output); calls past a module's known depths are left alone."""
        calls: dict[int, int] = {}
        with ExitStack() as stack:
            stack.callback(self.model.register_forward_pre_hook(
                lambda module, args: calls.clear()).remove)
            for key, module in self.modules.items():
                def hook(module: nn.Module, args: Any, output: Any, key: int = key) -> Any:
                    k = calls.get(key, 0)
                    calls[key] = k + 1
                    depths = self.depths[key]
                    return fn(depths[k], output) if k < len(depths) else None
                stack.callback(module.register_forward_hook(hook).remove)
            yield

    def reading(self, store: dict[int, torch.Tensor], below: int) -> Any:
        """Hooks keeping the residual update of each depth before ``below`` in ``store``
        (``{depth: [batch, seq, d_model]}``)."""
        def keep(depth: int, output: Any) -> None:
            if depth < below:
                store[depth] = residual_update(output).detach()
        return self._hooked(keep)

    def frozen(self, values: Mapping[int, torch.Tensor], copies: int) -> Any:
        """Hooks replacing the residual update of each depth in ``values`` by its value
        ``[batch, seq, d_model]`` repeated ``copies`` times along the batch."""
        fixed = {depth: value.repeat(copies, *[1] * (value.ndim - 1))
                 for depth, value in values.items()}

        def freeze(depth: int, output: Any) -> Any:
            return _with_update(output, fixed[depth]) if depth in fixed else None
        return self._hooked(freeze)
