"""Repeat the examples only where the patches begin, and replay the layers before.

A forward of ``c`` patches repeats ``b`` examples ``c`` times (:mod:`attnprobe.patch.units`),
but every layer before the first patched one computes the same thing for every repetition.
:class:`LateTiling` runs those layers on the ``b`` examples once and repeats the batch at the
entrance of the first patched layer's block — a forward pre-hook on every block from there on
repeats each batch-major tensor it is given (the hidden states, the attention mask, position
ids or rotary tables with ``b`` rows), so the layers after it see ``c · b`` rows exactly as if
the inputs had been repeated. For a sweep over every head this skips about half of the
computation.

The layers before the first patched one compute, for the ``b`` examples, what they computed in
the base run (the corrupted run when denoising), which every experiment runs first: with that
run's block outputs recorded (:meth:`LateTiling.recording`), those blocks **replay** them
instead of running (:meth:`LateTiling.from_layer` with ``replay=``): no layer runs twice on
the same input, and no forward runs a few-row batch through its early layers (the least
efficient matrix products on a CPU; ``analyses/bench_patch.py`` measures the saving).

It applies to models whose layers are distinct modules of one list (transformers models with
one attention stack, attnprobe's reference models) and is **checked on each model before it
is trusted**: a forward repeated from a patched layer without any patch must give the base
run's metric for every repetition (:meth:`LateTiling.check`), and then so must one that
replays the blocks before it; a model that fails the first (or raises) runs with its inputs
repeated as before, one that fails the second runs the early blocks on the examples once.
The numbers equal those of repeated inputs up to float rounding (the early layers run on a
smaller batch, or ran in the base run, whose scoped layers used the eager attention).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from attnprobe.capture import discovery, hf, hooks
from attnprobe.capture.sites import Site

__all__ = ["LateTiling", "Outputs", "blocks_of"]

_AGREE = 1e-4  # relative: a repetition's metric against the base run's (float rounding only)
# model -> whether its checks passed (repeating, replaying; None: not checked yet): a
# model's layer structure is checked once per process
_VERDICTS: weakref.WeakKeyDictionary[nn.Module, tuple[bool, bool | None]] = \
    weakref.WeakKeyDictionary()
Outputs = dict[int, Any]  # layer -> what its block returned in the base run


def _sites(model: nn.Module) -> list[Site]:
    if hf.is_hf_model(model):
        return list(discovery.hf_sites(model))
    return hooks.path_sites(model, hooks.hook_point_paths(model))


def blocks_of(model: nn.Module) -> dict[int, nn.Module] | None:
    """Per layer the block holding its attention — the item of the model's layer list — or
    None when the layers are not distinct items of one list (shared layers, several attention
    stacks, sites outside a list)."""
    try:
        sites = _sites(model)
    except (AttributeError, RuntimeError, ValueError, KeyError):  # the seams cannot read it
        return None
    stacks = {site.stack for site in sites}
    if len(stacks) != 1 or not sites or any(s.kind != "self" or s.call for s in sites):
        return None
    (stack,) = stacks
    try:
        layers = model.get_submodule(stack) if stack else None
    except AttributeError:
        return None
    if not isinstance(layers, nn.ModuleList):
        return None
    blocks: dict[int, nn.Module] = {}
    for site in sites:
        if not 0 <= site.layer < len(layers) or not site.path.startswith(
                f"{stack}.{site.layer}."):
            return None
        blocks[site.layer] = layers[site.layer]
    if len({id(b) for b in blocks.values()}) != len(blocks) or len(blocks) != len(layers):
        return None
    return blocks


def _repeat(value: Any, rows: int, copies: int) -> Any:
    """``value`` with every tensor of ``rows`` batch rows (2-D or more) repeated ``copies``
    times along the batch axis (inside tuples and lists too)."""
    if isinstance(value, torch.Tensor):
        if value.ndim >= 2 and value.shape[0] == rows:
            return value.repeat(copies, *[1] * (value.ndim - 1))
        return value
    if isinstance(value, tuple):
        return tuple(_repeat(v, rows, copies) for v in value)
    if isinstance(value, list):
        return [_repeat(v, rows, copies) for v in value]
    return value


class LateTiling:
    """Repeat the batch at the first patched layer (module docstring); ``usable`` until a
    check fails."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.blocks = blocks_of(model)
        verdict = _VERDICTS.get(model, (None, None)) if self.blocks else (False, False)
        self.checked: bool | None = verdict[0]
        self.replays: bool | None = verdict[1]  # the early blocks can replay the base run

    @property
    def usable(self) -> bool:
        return self.checked is not False

    @contextmanager
    def recording(self, into: Outputs) -> Iterator[None]:
        """Within the block, ``into`` (cleared first) keeps what each block returns,
        ``{layer: output}`` (the base run's, for :meth:`from_layer`'s ``replay``)."""
        into.clear()
        with ExitStack() as stack:
            for at, block in (self.blocks or {}).items():
                def keep(module: nn.Module, args: tuple, output: Any, at: int = at) -> None:
                    into[at] = output
                stack.callback(block.register_forward_hook(keep).remove)
            yield

    @contextmanager
    def from_layer(self, layer: int, rows: int, copies: int,
                   replay: Outputs | None = None) -> Iterator[None]:
        """Within the block, a forward of ``rows`` examples runs as ``copies · rows`` rows
        from ``layer`` on (copy ``k`` is rows ``k·rows ..``); with ``replay`` (the base run's
        block outputs, :meth:`recording`), the blocks before ``layer`` return their output
        there instead of running."""
        blocks = self.blocks or {}
        if not self._covers(replay, layer):
            replay = None  # not recorded: run them

        def repeat(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return _repeat(args, rows, copies), {k: _repeat(v, rows, copies)
                                                 for k, v in kwargs.items()}

        with ExitStack() as stack:
            for at, block in blocks.items():
                if at >= layer:
                    handle = block.register_forward_pre_hook(repeat, with_kwargs=True)
                    stack.callback(handle.remove)
                elif replay is not None:
                    stack.enter_context(_replayed(block, replay[at]))
            yield

    def check(self, run: Any, layer: int, expected: np.ndarray, measure: Any,
              inputs: dict[str, torch.Tensor], replay: Outputs | None = None) -> bool:
        """Once per model (and process): ``run(inputs)`` repeated twice from ``layer`` must give
        ``expected`` (the base run's metric ``[example]``) for both repetitions, through
        ``measure(output, copies) -> [copies, example]``; then, given ``replay`` (the base
        run's block outputs), so must the same forward replaying the blocks before ``layer``
        (:attr:`replays`). Returns whether repeating is trusted."""
        if self.checked is None:
            self.checked = self._agrees(run, layer, expected, measure, inputs, None)
        if self.checked and self.replays is None and self._covers(replay, layer):
            self.replays = self._agrees(run, layer, expected, measure, inputs, replay)
        elif not self.checked:
            self.replays = False
        _VERDICTS[self.model] = (self.checked, self.replays)
        return self.checked

    def _covers(self, replay: Outputs | None, layer: int) -> bool:
        """Whether ``replay`` holds the output of every block before ``layer`` (and there is
        one)."""
        early = [at for at in self.blocks or {} if at < layer]
        return replay is not None and bool(early) and all(at in replay for at in early)

    def _agrees(self, run: Any, layer: int, expected: np.ndarray, measure: Any,
                inputs: dict[str, torch.Tensor], replay: Outputs | None) -> bool:
        rows = inputs["input_ids"].shape[0]
        try:
            with self.from_layer(layer, rows, 2, replay):
                output = run(inputs)
            found = measure(output, 2)
        except (RuntimeError, ValueError, IndexError, TypeError, KeyError, AttributeError):
            return False
        scale = np.maximum(1.0, np.abs(expected))
        return found.shape == (2, len(expected)) and bool(
            (np.abs(found - expected[None]) <= _AGREE * scale[None]).all())


@contextmanager
def _replayed(block: nn.Module, output: Any) -> Iterator[None]:
    """Within the block, calling ``block`` returns ``output`` without running it (its hooks
    still run); an instance-level ``forward`` set by someone else (e.g. accelerate's device
    hooks) is put back after."""
    missing = object()
    own = block.__dict__.get("forward", missing)
    block.forward = lambda *args, **kwargs: output  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own is missing:
            del block.forward
        else:
            block.forward = own  # type: ignore[method-assign]
