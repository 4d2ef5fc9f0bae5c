"""Parts that change what a forward computes: rewrites of a site's tensors, and knockouts.

===============  =======================================================  ==================
part             rewrites (``fn(layer, tensor) -> tensor``)               seams
===============  =======================================================  ==================
``Edit``         the weights ``[batch, head, query, key]`` between the     every seam
                 softmax and the values
``EditOutput``   per-head outputs ``[batch, head, query, d_head]`` before  hf, hook_points
                 the output projection (weights times values)
``EditQuery``    queries ``[batch, head, query, d_head]`` (after RoPE)     hf, hook_points
``EditKey``      keys ``[batch, kv_head, key, d_head]`` (after RoPE)       hf, hook_points
``EditValue``    values ``[batch, kv_head, key, d_head]``                  hf, hook_points
``Knockout``     blocks edges (query i may not read key j) before the      every seam
                 softmax: ``fn(layer, shape) -> bool [batch, head, q, k]``
===============  =======================================================  ==================

``fn`` gets a copy of every head of the layer (an in-place edit that returns its argument
works); what it returns for heads outside the scope is dropped (for grouped keys and values:
the key/value heads that serve no query head of the scope). Every rewrite is checked — same
shape, finite in the model's dtype — and the capture checks that some rewrite changed
something (:class:`~attnprobe.errors.EditNotAppliedError`), as it checks that a knockout
blocked some edge a row could see. A knockout removes the blocked keys before the softmax: the
row renormalises over the keys it keeps (Geva et al. 2023); keys the model masks stay masked,
and a knockout that would leave a real row no key is an error.

The seams that serve q, k, v and per-head outputs: transformers models that route attention
through the interface (the ``hf`` seam: LLaMA, GPT-2, BERT, Qwen2, ... — most of the support
table) and attnprobe's reference models (their ``hook_q / hook_k / hook_v / hook_z`` points).
Models whose attention modules compute their weights themselves (GPT-Neo, Bloom, DeBERTa ...)
serve the weights, the scores and knockouts only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from attnprobe.capture.parts import Host, Part
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError

__all__ = ["Edit", "EditFn", "EditKey", "EditOutput", "EditQuery", "EditValue", "Knockout",
           "KnockoutFn", "checked"]

EditFn = Callable[[int, torch.Tensor], torch.Tensor]
KnockoutFn = Callable[[int, torch.Size], torch.Tensor]


def _scope_heads(host: Host, site: Site, n: int, n_heads: int) -> tuple[int, ...]:
    """Indices along a tensor's head axis (``n`` heads) that the scope lets a rewrite touch:
    its query heads, or for ``n < n_heads`` grouped key/value heads, the ones serving them."""
    heads = host.scope.heads_of(site.layer, n_heads)
    if n == n_heads:
        return heads
    group = n_heads // n
    return tuple(sorted({h // group for h in heads}))


def checked(host: Host, site: Site, before: torch.Tensor, edited: object, what: str,
            n_heads: int) -> torch.Tensor:
    """A rewrite's result ``[batch, head, ...]``, checked: same shape, finite in the model's
    dtype; heads outside the scope keep ``before`` (the tensor as it was before the rewrite
    ran), against which the change is noted (``host.edit_changes``)."""
    if not isinstance(edited, torch.Tensor) or edited.shape != before.shape:
        got = tuple(edited.shape) if isinstance(edited, torch.Tensor) else type(edited).__name__
        raise InputError(f"{what} at {site.path} must return a tensor of shape "
                         f"{tuple(before.shape)}; got {got}")
    dtype = str(before.dtype).removeprefix("torch.")
    if not torch.isfinite(edited).all():
        raise InputError(f"{what} at {site.path} returned NaN or inf (the model computes in "
                         f"{dtype}, largest value {torch.finfo(before.dtype).max:.3g})")
    cast = edited.to(device=before.device, dtype=before.dtype)
    if not torch.isfinite(cast).all():  # e.g. float32 results beyond float16's 65504
        raise InputError(f"{what} at {site.path} returned values that overflow the model's "
                         f"{dtype} (largest {edited.abs().max().item():.3g}, {dtype} holds "
                         f"{torch.finfo(before.dtype).max:.3g})")
    heads = _scope_heads(host, site, before.shape[1], n_heads)
    if len(heads) < before.shape[1]:  # the scope says which heads a rewrite may touch
        inside = torch.zeros(before.shape[1], dtype=torch.bool, device=before.device)
        inside[list(heads)] = True
        cast = torch.where(inside.view(-1, *[1] * (before.ndim - 2)), cast, before)
    change = (cast - before).abs().max().item() if before.numel() else 0.0
    host.edit_changes[site] = max(host.edit_changes.get(site, 0.0), change)
    return cast


@dataclass(frozen=True)
class _Rewrite(Part):
    """A part that replaces tensor :attr:`tensor` of the forward with ``fn(layer, tensor)``."""

    fn: EditFn = field(repr=False, default=None)  # type: ignore[assignment]
    rewrites: ClassVar[bool] = True
    tensor: ClassVar[str] = "pattern"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InputError(f"{self.name} needs a function fn(layer, tensor) -> tensor; got "
                             f"{type(self.fn).__name__}")

    @property
    def tensors(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.tensor,)

    def on_tensor(self, host: Host, site: Site, name: str, tensor: torch.Tensor,
                  n_heads: int) -> torch.Tensor:
        """``fn(layer, copy of tensor)``, checked (:func:`checked`)."""
        return checked(host, site, tensor, self.fn(site.layer, tensor.clone()), self.name,
                       n_heads)


@dataclass(frozen=True)
class Edit(_Rewrite):
    """``fn(layer, pattern) -> pattern`` on the scoped layers' weights ``[batch, head, query,
    key]`` between the softmax and the values (every seam)."""

    name: ClassVar[str] = "edit"


@dataclass(frozen=True)
class EditOutput(_Rewrite):
    """``fn(layer, output) -> output`` on the per-head outputs ``[batch, head, query, d_head]``
    (weights times values, before the output projection), e.g. mean-ablation or patching a
    head's output."""

    name: ClassVar[str] = "edit_output"
    seams: ClassVar[tuple[str, ...]] = ("hf", "hook_points", "paths")
    tensor: ClassVar[str] = "z"


@dataclass(frozen=True)
class EditQuery(_Rewrite):
    """``fn(layer, q) -> q`` on the queries ``[batch, head, query, d_head]`` the scores are
    computed from (after rotary embeddings)."""

    name: ClassVar[str] = "edit_query"
    seams: ClassVar[tuple[str, ...]] = ("hf", "hook_points", "paths")
    tensor: ClassVar[str] = "q"


@dataclass(frozen=True)
class EditKey(_Rewrite):
    """``fn(layer, k) -> k`` on the keys ``[batch, kv_head, key, d_head]`` (after rotary
    embeddings; grouped-query models: the shared key heads)."""

    name: ClassVar[str] = "edit_key"
    seams: ClassVar[tuple[str, ...]] = ("hf", "hook_points", "paths")
    tensor: ClassVar[str] = "k"


@dataclass(frozen=True)
class EditValue(_Rewrite):
    """``fn(layer, v) -> v`` on the values ``[batch, kv_head, key, d_head]``."""

    name: ClassVar[str] = "edit_value"
    seams: ClassVar[tuple[str, ...]] = ("hf", "hook_points", "paths")
    tensor: ClassVar[str] = "v"


@dataclass(frozen=True)
class Knockout(Part):
    """``fn(layer, shape) -> bool`` broadcastable to ``shape`` = ``[batch, head, query, key]``:
    True blocks the edge (query i may not read key j) in that layer, before the softmax.
    Only the scope's heads are knocked out."""

    fn: KnockoutFn = field(repr=False, default=None)  # type: ignore[assignment]
    name: ClassVar[str] = "knockout"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InputError(f"knockout needs a function fn(layer, shape) -> bool tensor; got "
                             f"{type(self.fn).__name__}")

    def blocked(self, host: Host, site: Site, shape: torch.Size) -> torch.Tensor | None:
        mask = self.fn(site.layer, shape)
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise InputError(f"knockout at {site.path} must return a bool tensor (True = "
                             f"blocked); got {getattr(mask, 'dtype', type(mask).__name__)}")
        try:
            mask = torch.broadcast_to(mask, shape)
        except RuntimeError:
            raise InputError(f"knockout at {site.path} returned shape {tuple(mask.shape)}, "
                             f"which does not broadcast to {tuple(shape)}") from None
        heads = host.scope.heads_of(site.layer, shape[1])
        if len(heads) < shape[1]:
            inside = torch.zeros(shape[1], dtype=torch.bool, device=mask.device)
            inside[list(heads)] = True
            mask = mask & inside[None, :, None, None]
        return mask
