"""The residual stream and the MLP outputs per (layer, position): where they are in a model,
and the forward hooks that read and rewrite them.

==============  ==========================================  ================================
site            the tensor ``[batch, seq, d_model]``         read / rewritten at
==============  ==========================================  ================================
``resid_pre``   the residual stream entering block ``l``     the block's input (pre-hook)
``resid_mid``   after attention, before the MLP:             the block's input plus its
                ``resid_pre + attn_out``                     attention module's output
``resid_post``  the block's output (``resid_pre`` of         the block's output
                ``l + 1``; the final norm's input after
                the last block)
``mlp_out``     what the MLP adds to the residual            the MLP module's output
==============  ==========================================  ================================

These are TransformerLens's ``blocks.{l}.hook_resid_pre`` / ``hook_resid_mid`` /
``hook_resid_post`` / ``hook_mlp_out``. ``resid_pre`` and ``resid_post`` need only a model
whose layers are distinct blocks of one list (GPT-2, LLaMA, BERT, the reference models ...;
not ALBERT, whose one layer runs several times). ``resid_mid`` and ``mlp_out`` exist as sums
only in a **pre-norm** block (``x + attn(norm1(x))``, then ``+ mlp(norm2(x))``; the modules
come from :func:`attnprobe.weights.anatomy.anatomy`): a post-norm block (BERT) normalises
``x + attn(x)`` before the MLP reads it, so they are refused in one line. Every read of
``resid_mid`` or ``mlp_out`` checks that the parts add up to the block's output
(:class:`~attnprobe.weights.anatomy.DecompositionError` otherwise).

Rewriting ``resid_mid`` adds ``target − resid_mid`` to the attention output at the patched
entries only (``x − x`` is exactly 0 elsewhere, so nothing else moves by a rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.errors import HookNotFiredError, InputError
from attnprobe.patch.late_tiling import blocks_of
from attnprobe.weights.anatomy import DecompositionError, anatomy

__all__ = ["STREAM_SITES", "Stream", "StreamSite", "stream_site"]

Rewrite = Callable[[int, torch.Tensor], torch.Tensor]  # (layer, [rows, seq, d]) -> same
ADD_UP = 1e-4  # relative to the largest |value|: parts that add up differ by rounding only


@dataclass(frozen=True)
class StreamSite:
    """One point of the residual stream (module docstring): its name, what it is, and
    whether it needs the attention and MLP modules of a pre-norm block."""

    name: str
    meaning: str
    pre_norm: bool


STREAM_SITES: dict[str, StreamSite] = {s.name: s for s in (
    StreamSite("resid_pre", "the residual stream entering the block", False),
    StreamSite("resid_mid", "the residual stream after attention, before the MLP", True),
    StreamSite("resid_post", "the residual stream leaving the block", False),
    StreamSite("mlp_out", "the MLP's output, added to the residual stream", True),
)}


def stream_site(name: str) -> StreamSite:
    """The :class:`StreamSite` of ``name`` (one-line error naming the sites otherwise)."""
    if name not in STREAM_SITES:
        raise InputError(f"unknown stream site {name!r}; choose one of "
                         f"{', '.join(STREAM_SITES)}")
    return STREAM_SITES[name]


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a block is called with (first positional, or ``hidden_states``)."""
    value = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(value, torch.Tensor) or value.ndim != 3:
        raise InputError("residual patching reads a block's hidden states [batch, seq, "
                         "d_model] as its first argument; this model's blocks take "
                         f"{type(value).__name__}")
    return value


def _first(output: Any) -> torch.Tensor:
    """A module output's hidden states (the output, or the first item of a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output: Any, value: torch.Tensor) -> Any:
    return (value, *output[1:]) if isinstance(output, tuple) else value


class Stream:
    """The modules holding ``site`` in ``model`` (checked before any forward: a one-line
    InputError when the model cannot serve it) and the hooks that read or rewrite it."""

    def __init__(self, model: nn.Module, site: str) -> None:
        self.site = stream_site(site)
        blocks = blocks_of(model)
        kind = type(model).__name__
        if blocks is None:
            raise InputError(f"patching {site} needs a model whose layers are distinct blocks "
                             f"of one list (GPT-2, LLaMA, BERT ...); {kind}'s are not (shared "
                             "or looped layers, several attention stacks)")
        self.blocks = blocks
        self.attn: dict[int, nn.Module] = {}
        self.mlps: dict[int, nn.Module] = {}
        if self.site.pre_norm:
            try:
                layers = anatomy(model).layers
            except InputError as exc:
                raise InputError(f"{site} is a sum only in a pre-norm block (x + attn(norm(x)), "
                                 f"then + mlp(norm(x))); resid_pre and resid_post serve every "
                                 f"model: {exc}") from None
            self.attn = {layer.index: layer.attn for layer in layers}
            self.mlps = {layer.index: layer.mlp for layer in layers if layer.mlp is not None}
            if site == "mlp_out" and not self.mlps:
                raise InputError(f"{kind} has no MLP (attention-only): nothing to patch at "
                                 "mlp_out")

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers that hold the site."""
        if self.site.name == "mlp_out":
            return tuple(sorted(self.mlps))
        return tuple(sorted(self.blocks))

    # ------------------------------------------------------------------ reading
    @contextmanager
    def reading(self, store: dict[int, torch.Tensor]) -> Iterator[None]:
        """Within the block, ``store[layer]`` gets the site's tensor ``[batch, seq,
        d_model]`` (detached) of every layer of each forward; ``resid_mid`` and ``mlp_out``
        are checked to add up to the block's output."""
        parts: dict[str, dict[int, torch.Tensor]] = {"pre": {}, "attn": {}, "mlp": {},
                                                      "post": {}}
        with ExitStack() as stack:
            for layer, block in self.blocks.items():
                stack.enter_context(_pre_hook(block, _keeper(parts["pre"], layer)))
                stack.enter_context(_hook(block, _keeper(parts["post"], layer)))
            for layer, module in self.attn.items():
                stack.enter_context(_hook(module, _keeper(parts["attn"], layer)))
            for layer, module in self.mlps.items():
                stack.enter_context(_hook(module, _keeper(parts["mlp"], layer)))
            yield
        store.clear()
        for layer in self.layers:
            if layer not in parts["post"]:
                raise HookNotFiredError(f"block {layer} of the model never ran: no "
                                        f"{self.site.name} to read")
            store[layer] = self._value(layer, parts)

    def _value(self, layer: int, parts: dict[str, dict[int, torch.Tensor]]) -> torch.Tensor:
        pre, post = parts["pre"][layer], parts["post"][layer]
        if not self.site.pre_norm:
            return pre if self.site.name == "resid_pre" else post
        mid = pre + parts["attn"][layer]
        mlp = parts["mlp"].get(layer)
        total = mid if mlp is None else mid + mlp
        scale = max(1.0, float(post.abs().max()))
        if float((total - post).abs().max()) > ADD_UP * scale:
            raise DecompositionError(f"layer {layer}: the block input plus its attention and "
                                     "MLP outputs do not add up to the block's output, so "
                                     f"{self.site.name} is not what the block adds (not a "
                                     "plain pre-norm residual block)")
        return mid if self.site.name == "resid_mid" else mlp  # type: ignore[return-value]

    # ------------------------------------------------------------------ rewriting
    @contextmanager
    def rewriting(self, layers: tuple[int, ...], fn: Rewrite) -> Iterator[None]:
        """Within the block, every forward's site tensor of ``layers`` is replaced by
        ``fn(layer, tensor)`` (a copy it may edit in place; rows of the whole forward).
        Raises HookNotFiredError after a forward in which a layer's hook never ran."""
        fired: set[int] = set()
        name = self.site.name
        with ExitStack() as stack:
            for layer in layers:
                if name == "resid_pre":
                    stack.enter_context(_pre_hook(self.blocks[layer],
                                                  _input_rewrite(layer, fn, fired)))
                elif name == "resid_post":
                    stack.enter_context(_hook(self.blocks[layer],
                                              _output_rewrite(layer, fn, fired)))
                elif name == "mlp_out":
                    stack.enter_context(_hook(self.mlps[layer],
                                              _output_rewrite(layer, fn, fired)))
                else:  # resid_mid: the attention output carries the change
                    seen: dict[int, torch.Tensor] = {}
                    stack.enter_context(_pre_hook(self.blocks[layer], _keeper(seen, layer)))
                    stack.enter_context(_hook(self.attn[layer],
                                              _mid_rewrite(layer, fn, fired, seen)))
            yield
        missing = sorted(set(layers) - fired)
        if missing:
            raise HookNotFiredError(f"the {name} hook of layer(s) {missing} never ran")


def _keeper(store: dict[int, torch.Tensor], layer: int) -> Callable[..., None]:
    def keep(module: nn.Module, args: tuple, kwargs_or_output: Any, *rest: Any) -> None:
        if rest:  # forward hook with kwargs: (module, args, kwargs, output)
            store[layer] = _first(rest[0]).detach()
        elif isinstance(kwargs_or_output, dict):  # pre-hook with kwargs
            store[layer] = _hidden(args, kwargs_or_output).detach()
        else:
            store[layer] = _first(kwargs_or_output).detach()
    return keep


def _input_rewrite(layer: int, fn: Rewrite, fired: set[int]) -> Callable[..., Any]:
    def rewrite(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        fired.add(layer)
        # a copy: the caller's tensor is also the previous block's output (hidden_states
        # returned by the model)
        value = fn(layer, _hidden(args, kwargs).clone())
        if args:
            return (value, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": value}
    return rewrite


def _output_rewrite(layer: int, fn: Rewrite, fired: set[int]) -> Callable[..., Any]:
    def rewrite(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        fired.add(layer)
        return _replace_first(output, fn(layer, _first(output).clone()))
    return rewrite


def _mid_rewrite(layer: int, fn: Rewrite, fired: set[int], seen: dict[int, torch.Tensor]
                 ) -> Callable[..., Any]:
    def rewrite(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        fired.add(layer)
        attn = _first(output)
        mid = seen[layer] + attn  # what the block adds next, [rows, seq, d_model]
        target = fn(layer, mid.clone())
        return _replace_first(output, attn + (target - mid))
    return rewrite


@contextmanager
def _pre_hook(module: nn.Module, fn: Callable[..., Any]) -> Iterator[None]:
    handle = module.register_forward_pre_hook(fn, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def _hook(module: nn.Module, fn: Callable[..., Any]) -> Iterator[None]:
    handle = module.register_forward_hook(fn, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
