"""What can be patched: the activations of a head, read and rewritten through the capture seam.

=========  ==========================================  =====================  ===============
site       tensor (``position`` is axis 2)               head axis              seams
=========  ==========================================  =====================  ===============
``output``  per-head output z ``[batch, head, query,     query heads            hf, hook points
            d_head]`` (weights × values, before the
            output projection: head ``h`` writes
            ``z_h · W_O^h``)
``pattern`` weights ``[batch, head, query, key]``        query heads            every seam
            (a position is a query row)
``q``       queries ``[batch, head, query, d_head]``     query heads            hf, hook points
            (after RoPE)
``k``       keys ``[batch, kv_head, key, d_head]``       key/value heads (GQA)  hf, hook points
            (after RoPE)
``v``       values ``[batch, kv_head, key, d_head]``     key/value heads (GQA)  hf, hook points
=========  ==========================================  =====================  ===============

**Which models serve which sites.** transformers models that route attention through the
attention interface (the ``hf`` seam: LLaMA, Mistral, Qwen2, GPT-2, BERT, RoBERTa, ... — most of
the README's support table) and attnprobe's reference models (their ``hook_q/k/v/z`` points)
serve every site. Models whose attention modules compute their weights themselves (the module
seam: GPT-Neo, Bloom, Falcon, DeBERTa, MPNet ...) serve ``pattern`` only:
:func:`check_served` says so before any forward.

**Grouped-query attention.** ``k`` and ``v`` are shared by the query heads of a group, so a
``k``/``v`` patch acts on a key/value head (and through it on every query head it serves):
the table's ``head`` is then the key/value head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from attnprobe.capture import hf
from attnprobe.capture.context import Capture
from attnprobe.capture.discovery import seams_of
from attnprobe.capture.parts import Activations, Live, Part
from attnprobe.capture.rewrites import (
    Edit,
    EditFn,
    EditKey,
    EditOutput,
    EditQuery,
    EditValue,
)
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError

__all__ = ["SERVED_BY", "SITES", "SiteSpec", "by_layer", "check_served", "readers", "rewriter",
           "site_spec", "tensors_of"]

T = TypeVar("T")


@dataclass(frozen=True)
class SiteSpec:
    """One patchable site: its capture tensor (:data:`attnprobe.capture.parts.TENSORS`), the
    rewrite part that replaces it, and whether its head axis is the key/value heads."""

    name: str
    tensor: str
    rewrite: type[Part]
    kv_heads: bool = False


SITES: dict[str, SiteSpec] = {
    "output": SiteSpec("output", "z", EditOutput),
    "pattern": SiteSpec("pattern", "pattern", Edit),
    "q": SiteSpec("q", "q", EditQuery),
    "k": SiteSpec("k", "k", EditKey, kv_heads=True),
    "v": SiteSpec("v", "v", EditValue, kv_heads=True),
}
SERVED_BY = ("output, q, k and v are served by transformers models that use the attention "
             "interface (LLaMA, Mistral, Qwen2, GPT-2, BERT, ...) and attnprobe's reference "
             "models; models whose attention modules compute the weights themselves (GPT-Neo, "
             "Bloom, Falcon, DeBERTa, MPNet ...) serve pattern only")


def site_spec(name: str) -> SiteSpec:
    """The :class:`SiteSpec` of ``name`` (one-line error naming the sites otherwise)."""
    if name not in SITES:
        raise InputError(f"unknown site {name!r}; choose one of {', '.join(SITES)}")
    return SITES[name]


def _seams(model: nn.Module) -> tuple[str, ...]:
    return seams_of(model) if hf.is_hf_model(model) else ("hook_points",)


def readers(tensors: Sequence[str], *, grad: bool = False) -> list[Part]:
    """The capture parts that keep ``tensors`` (of ``q k v z pattern``) of every scoped
    layer: :class:`~attnprobe.capture.parts.Activations` for q/k/v/z (``cap.activations``),
    :class:`~attnprobe.capture.parts.Live` for the weights (``cap.live``)."""
    parts: list[Part] = []
    names = tuple(dict.fromkeys(t for t in tensors if t != "pattern"))
    if names:
        parts.append(Activations(names, grad=grad))
    if "pattern" in tensors:
        parts.append(Live())
    return parts


def rewriter(spec: SiteSpec, fn: EditFn) -> Part:
    """The rewrite part of ``spec`` applying ``fn(layer, tensor) -> tensor``."""
    return spec.rewrite(fn)  # type: ignore[call-arg]


def check_served(model: nn.Module, sites: Sequence[str], what: str) -> None:
    """A one-line InputError before any forward when the model's seam cannot read or rewrite
    one of ``sites`` (module docstring: which families serve which sites)."""
    seams = _seams(model)
    for name in sites:
        spec = site_spec(name)
        parts = [*readers([spec.tensor]), rewriter(spec, lambda layer, t: t)]
        for part in parts:
            for seam in seams:
                try:
                    part.check_seam(seam)
                except InputError:
                    raise InputError(
                        f"{what} cannot patch site {name!r} of {type(model).__name__}: its "
                        f"attention modules compute the weights themselves; {SERVED_BY}"
                    ) from None


def by_layer(found: Mapping[Site, T]) -> dict[int, T]:
    """``{site: value}`` of one capture keyed by layer; a layer with several attention sites
    (encoder-decoder models: self- and cross-attention) is an error."""
    out: dict[int, T] = {}
    for site, value in found.items():
        if site.layer in out:
            raise InputError("patching covers models with one attention stack (decoders and "
                             f"encoders); layer {site.layer} has several attention sites "
                             f"({site.path} ...), as encoder-decoder models do")
        out[site.layer] = value
    return out


def tensors_of(cap: Capture, tensor: str) -> dict[int, torch.Tensor]:
    """Per layer, tensor ``tensor`` of the capture's first forward (module docstring shapes)."""
    if tensor == "pattern":
        live = cap.live
        return by_layer(live[0]) if live else {}
    acts = cap.activations
    return {layer: found[tensor] for layer, found in by_layer(acts[0]).items()} if acts else {}
