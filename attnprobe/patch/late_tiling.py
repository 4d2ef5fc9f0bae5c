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

**Shared and looped layers.** The blocks are the items of the model's one layer list; a model
may run one block at several depths (ALBERT's shared layer, a list holding one layer twice).
Depths are counted by the blocks' calls within a forward — depth ``d`` is the ``d``-th block
call, as the capture numbers the runs of a shared module (:mod:`attnprobe.capture.runs`) —
so the repetition starts at the first patched *depth*, not at the first call of its module.
Such a model never replays (its early depths run on the examples once): a replayed call would
skip a run the capture counts. The base run checks that layout (:class:`Layout`: one
attention run per block call, a module's first run at its own layer) before anything is
trusted.

It is **checked on each model before it is trusted**: a forward repeated from a patched layer
without any patch must give the base run's metric for every repetition, with one output row
per repetition (:meth:`LateTiling.check`), and then so must one that replays the blocks
before it; and the first patched forward is run both ways, the shortcut's metrics against
those of the inputs repeated (:meth:`LateTiling.confirm`; without a patch every repetition
is the same, so only a patch shows a patch landing at the wrong depth or row). A model that
fails the first or the last (or raises) runs with its inputs repeated as before, one that
fails the second runs the early blocks on the examples once. The numbers equal those of
repeated inputs up to float rounding (the early layers run on a smaller batch, or ran in the
base run, whose scoped layers used the eager attention).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from attnprobe.capture import discovery, hf, hooks
from attnprobe.capture.sites import Site

__all__ = ["LateTiling", "Layout", "Outputs", "Verdict", "blocks_of"]

_AGREE = 1e-4  # relative: a repetition's metric against the base run's (float rounding only)
Outputs = dict[int, Any]  # depth -> what its block call returned in the base run


@dataclass(frozen=True)
class Layout:
    """How the base run called the blocks: ``order[d]`` the list index of the block called at
    depth ``d`` (its first item, for a module the list holds several times); ``valid``:
    every block call ran one attention, and each attention module's first run was at its
    own layer (depth = block call, as the capture counts)."""

    order: tuple[int, ...]
    valid: bool

    @property
    def looped(self) -> bool:
        """Whether a block ran at several depths."""
        return len(set(self.order)) < len(self.order)


@dataclass
class Verdict:
    """What the checks found for one model (None: not checked yet): ``repeats`` (repeating
    from a layer keeps the base run), ``replays`` (so does replaying the blocks before it),
    ``confirmed`` (a patched forward agreed with the inputs repeated), ``layout`` (the base
    run's block calls)."""

    repeats: bool | None = None
    replays: bool | None = None
    confirmed: bool | None = None
    layout: Layout | None = None

    def refuse(self) -> None:
        self.repeats = self.replays = self.confirmed = False


# model -> its verdict: a model's layer structure is checked once per process
_VERDICTS: weakref.WeakKeyDictionary[nn.Module, Verdict] = weakref.WeakKeyDictionary()


def _sites(model: nn.Module) -> list[Site]:
    if hf.is_hf_model(model):
        return list(discovery.hf_sites(model))
    return hooks.path_sites(model, hooks.hook_point_paths(model))


def _item(stack: str, path: str) -> int | None:
    """The index in the layer list ``stack`` of the item ``path`` lies in, else None."""
    head, _, rest = path[len(stack) + 1:].partition(".") if path.startswith(f"{stack}.") \
        else ("", "", "")
    return int(head) if head.isdigit() and rest else None


def blocks_of(model: nn.Module) -> dict[int, nn.Module] | None:
    """Per item of the model's layer list the block (module) it holds — one module at several
    items when the list shares a layer — or None when the attention sites are not inside the
    items of one list (several attention stacks, sites outside a list), or an item holds
    none."""
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
    holding = set()
    for site in sites:
        at = _item(stack, site.path)
        if at is None or at >= len(layers):
            return None
        holding.add(id(layers[at]))
    if any(id(block) not in holding for block in layers):
        return None
    return dict(enumerate(layers))


def _attention(model: nn.Module) -> dict[int, tuple[nn.Module, int]]:
    """``{id(module): (module, layer)}`` of the modules the attention sites name."""
    found = {}
    for site in _sites(model):
        module = model.get_submodule(site.path)
        found.setdefault(id(module), (module, site.layer))
    return found


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


def _rows(output: Any) -> int | None:
    """The batch rows of a forward's output: those of its first tensor of 2 axes or more."""
    if isinstance(output, torch.Tensor):
        return int(output.shape[0]) if output.ndim >= 2 else None
    values = output.values() if isinstance(output, dict) else \
        output if isinstance(output, (tuple, list)) else ()
    for value in values:
        found = _rows(value)
        if found is not None:
            return found
    return None


class LateTiling:
    """Repeat the batch at the first patched depth (module docstring); ``usable`` until a
    check fails."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.blocks = blocks_of(model)
        if model not in _VERDICTS:
            _VERDICTS[model] = Verdict() if self.blocks else Verdict(False, False, False)
        self.verdict = _VERDICTS[model]

    @property
    def checked(self) -> bool | None:
        """Whether repeating from a layer is trusted (None: not checked yet)."""
        return self.verdict.repeats

    @property
    def replays(self) -> bool | None:
        """Whether the early blocks can replay the base run (None: not checked yet)."""
        return self.verdict.replays

    @property
    def confirmed(self) -> bool | None:
        """Whether a patched forward agreed with the inputs repeated (None: not run yet)."""
        return self.verdict.confirmed

    @property
    def usable(self) -> bool:
        return self.verdict.repeats is not False and self.verdict.confirmed is not False

    def _distinct(self) -> dict[int, tuple[int, nn.Module]]:
        """``{id(block): (first list index, block)}``: each module once (a module hooked
        twice would count its calls twice)."""
        found: dict[int, tuple[int, nn.Module]] = {}
        for at, block in (self.blocks or {}).items():
            found.setdefault(id(block), (at, block))
        return found

    @contextmanager
    def recording(self, into: Outputs) -> Iterator[None]:
        """Within the block, ``into`` (cleared first) keeps what each block call returns,
        ``{depth: output}`` (the base run's, for :meth:`from_layer`'s ``replay``), and the
        forward's block calls become the model's :class:`Layout` (refused when invalid)."""
        into.clear()
        order: list[int] = []
        inside: list[int | None] = [None]  # the depth of the block call running
        runs: list[tuple[int | None, int, int]] = []  # (depth, module, its layer) per run
        attention = _attention(self.model) if self.blocks else {}
        with ExitStack() as stack:
            for at, block in self._distinct().values():
                def enter(module: nn.Module, args: tuple, at: int = at) -> None:
                    inside[0] = len(order)
                    order.append(at)

                def keep(module: nn.Module, args: tuple, output: Any) -> None:
                    into[inside[0]] = output  # type: ignore[index]
                    inside[0] = None
                stack.callback(block.register_forward_pre_hook(enter).remove)
                stack.callback(block.register_forward_hook(keep).remove)
            for key, (module, layer) in attention.items():
                def ran(module: nn.Module, args: tuple, output: Any, key: int = key,
                        layer: int = layer) -> None:
                    runs.append((inside[0], key, layer))
                stack.callback(module.register_forward_hook(ran).remove)
            yield
        if self.blocks and order:
            self._note(Layout(tuple(order), _valid(len(order), runs)))

    def _note(self, layout: Layout) -> None:
        """Keep the base run's layout; one that is invalid, or changes between forwards,
        refuses the shortcut; a looped one never replays."""
        verdict = self.verdict
        if verdict.layout is not None and verdict.layout != layout:
            layout = Layout(layout.order, False)
        verdict.layout = layout
        if not layout.valid:
            verdict.refuse()
        elif layout.looped:
            verdict.replays = False

    @contextmanager
    def from_layer(self, layer: int, rows: int, copies: int,
                   replay: Outputs | None = None) -> Iterator[None]:
        """Within the block, a forward of ``rows`` examples runs as ``copies · rows`` rows
        from depth ``layer`` on (copy ``k`` is rows ``k·rows ..``): each block call from
        the ``layer``-th of the forward on repeats its inputs; with ``replay`` (the base
        run's block outputs, :meth:`recording`; never for a looped layout), the blocks before
        ``layer`` return their output there instead of running."""
        if not self._covers(replay, layer):
            replay = None  # not recorded, or looped: run them
        calls = [0]

        def start(module: nn.Module, args: tuple) -> None:
            calls[0] = 0

        def repeat(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            depth, calls[0] = calls[0], calls[0] + 1
            if depth < layer:
                return None
            return _repeat(args, rows, copies), {k: _repeat(v, rows, copies)
                                                 for k, v in kwargs.items()}

        with ExitStack() as stack:
            stack.callback(self.model.register_forward_pre_hook(start).remove)
            for _, block in self._distinct().values():
                handle = block.register_forward_pre_hook(repeat, with_kwargs=True)
                stack.callback(handle.remove)
            if replay is not None:
                for at, block in (self.blocks or {}).items():
                    if at < layer:
                        stack.enter_context(_replayed(block, replay[at]))
            yield

    def check(self, run: Any, layer: int, expected: np.ndarray, measure: Any,
              inputs: dict[str, torch.Tensor], replay: Outputs | None = None) -> bool:
        """Once per model (and process): ``run(inputs)`` repeated twice from ``layer`` must give
        ``expected`` (the base run's metric ``[example]``) for both repetitions, through
        ``measure(output, copies) -> [copies, example]``, in an output of twice the rows;
        then, given ``replay`` (the base run's block outputs), so must the same forward
        replaying the blocks before ``layer`` (:attr:`replays`). Returns whether repeating
        is trusted (and no check has failed)."""
        verdict = self.verdict
        if verdict.layout is None:  # no base run recorded its block calls: nothing to trust
            return False
        if verdict.repeats is None:
            verdict.repeats = self._agrees(run, layer, expected, measure, inputs, None)
        if verdict.repeats and verdict.replays is None and self._covers(replay, layer):
            verdict.replays = self._agrees(run, layer, expected, measure, inputs, replay)
        elif not verdict.repeats:
            verdict.replays = False
        return self.usable

    def confirm(self, found: np.ndarray, plain: np.ndarray) -> bool:
        """Once per model: the metrics ``[copies, example]`` of a patched forward through the
        shortcut against ``plain``, those of the same patches on the inputs repeated. When
        they differ, the shortcut is refused from now on (the caller keeps ``plain``)."""
        scale = np.maximum(1.0, np.abs(plain))
        agrees = found.shape == plain.shape and bool((np.abs(found - plain) <= _AGREE * scale)
                                                     .all())
        if agrees:
            self.verdict.confirmed = True
        else:
            self.verdict.refuse()
        return agrees

    def _covers(self, replay: Outputs | None, layer: int) -> bool:
        """Whether ``replay`` holds the output of every block before ``layer`` (and there is
        one), on a layout whose blocks run once each."""
        layout = self.verdict.layout
        if replay is None or layout is None or layout.looped or not layout.valid:
            return False
        early = [at for at in self.blocks or {} if at < layer]
        return bool(early) and all(at in replay for at in early)

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
        # an output of the examples once would read as the base run for every repetition
        return _rows(output) == 2 * rows and found.shape == (2, len(expected)) and bool(
            (np.abs(found - expected[None]) <= _AGREE * scale[None]).all())


def _valid(calls: int, runs: list[tuple[int | None, int, int]]) -> bool:
    """Whether each of ``calls`` block calls ran one attention (``runs``: per attention run
    its block call's depth, its module and the module's own layer), and each module's first
    run was at its own layer (later runs are the next depths: :mod:`attnprobe.capture.runs`)."""
    depths = [depth for depth, _, _ in runs]
    if sorted(d for d in depths if d is not None) != list(range(calls)) or None in depths:
        return False
    seen: set[int] = set()
    for depth, key, layer in runs:
        if key not in seen and depth != layer:
            return False
        seen.add(key)
    return True


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
