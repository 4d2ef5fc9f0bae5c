"""Token importance read off the attention of one example.

Five views, each giving one score per input token (float64, non-negative):

- :func:`raw` — one row (or the mean / max over rows) of one layer's weights, heads averaged
  or one head.
- :func:`rollout` — Abnar & Zuidema (2020): residual-augmented, head-averaged attention
  ``A_l = 0.5·mean_h A_l,h + 0.5·I`` multiplied through the layers,
  ``Ã_1 = A_1, Ã_l = A_l · Ã_{l-1}``.
- :func:`flow` — Abnar & Zuidema's attention flow: the maximum flow from one node of a layer to
  every input token through the layered graph whose capacities are the ``A_l`` above.
- :func:`attention_x_gradient` — Chefer, Gur & Wolf (2021) generic rule:
  ``Ā_l = mean_h[(∂y/∂A_l ⊙ A_l)^+]``, ``R ← R + Ā_l·R`` from ``R = I``.
- :func:`norm_based` / :func:`norm_importance` — Kobayashi et al. (2020): ``‖α_ij f(x_j)‖`` with
  ``f(x_j) = (x_j W_V^h + b_V^h) W_O^h``.

:func:`attention_importance` runs any of them for every layer and returns
:class:`~attnprobe.types.TokenAttribution` objects named ``"{view}@L{layer}"`` (model layer
index, 0-based), or ``"attn_x_grad"``, which spans all layers.

Which query row is read (``query``): ``"cls"`` / ``"first"`` (row 0, the ``[CLS]`` row of BERT-like
models), ``"last"`` (the last row, for causal LMs), ``"mean"`` (mean over rows), ``"max"`` (max over
rows, as Abnar & Zuidema's DistilBERT script does), or an int row index (negative counts from the
end).

Flow is implemented in :mod:`attnprobe.attribution.attention_flow`, attention × gradient and
the norm views in :mod:`attnprobe.attribution.model_views`; every view is importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnprobe.attribution.attention_flow import FLOW_MAX_TOKENS, FLOW_SCALE, flow
from attnprobe.attribution.model_views import (
    NORM_FAMILIES,
    attention_x_gradient,
    attn_x_grad_matrix,
    check_norm_family,
    norm_based,
    norm_importance,
    norm_parts,
    one_text,
    target_name,
)
from attnprobe.attribution.view_common import HEAD_REDUCES as HEAD_REDUCES  # re-exported
from attnprobe.attribution.view_common import QUERIES as QUERIES  # re-exported
from attnprobe.attribution.view_common import (
    HeadReduce,
    Query,
    Target,
    augmented,
    check_stack,
    layer_position,
    read_query,
)
from attnprobe.capture.corpus import extract
from attnprobe.capture.text import Truncation
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, TokenAttribution

__all__ = [
    "FLOW_MAX_TOKENS",
    "FLOW_SCALE",
    "NORM_FAMILIES",
    "VIEWS",
    "attention_importance",
    "attention_x_gradient",
    "flow",
    "norm_based",
    "norm_importance",
    "raw",
    "rollout",
]

VIEWS = ("raw", "rollout", "flow", "attn_x_grad", "norm")


# ----------------------------------------------------------------------------- map views
def raw(amap: AttentionMap, layer: int, *, head: int | None = None,
        query: Query = "cls") -> torch.Tensor:
    """Raw attention of one layer as token importance.

    Args:
        amap: one example's map.
        layer: model layer index.
        head: model head index; ``None`` averages the heads.
        query: which row to read (module docstring).

    Returns:
        ``[key]`` float64.
    """
    if not isinstance(amap, AttentionMap):
        raise InputError(f"raw takes an AttentionMap; got {type(amap).__name__}")
    pos = layer_position(amap, layer)
    matrix = amap.pattern[pos].mean(0) if head is None else amap.head(layer, head)
    return read_query(matrix.to(torch.float64), query)


def rollout(amap: AttentionMap, *, residual: bool = True,
            head_reduce: HeadReduce = "mean") -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020, Eq. 1 and their ``compute_joint_attention``).

    ``A_l = 0.5·W_l + 0.5·I`` with ``W_l`` the head-reduced weights of layer ``l`` (rows
    renormalised; without ``residual``, ``A_l = W_l``), then ``Ã_0 = A_0`` and
    ``Ã_l = A_l · Ã_{l-1}``: row ``i`` of ``Ã_l`` is how much of position ``i`` after layer ``l``
    comes from each input token.

    Args:
        amap: a self-attention map holding layers ``0..L-1`` in order (``ap.extract`` default).
        residual: add the identity for the residual connection.
        head_reduce: ``"mean"`` (the paper), ``"max"`` or ``"min"`` over heads.

    Returns:
        ``[layer, query, key]`` float64; every row sums to 1.
    """
    check_stack(amap, "rollout")
    aug = augmented(amap, residual=residual, head_reduce=head_reduce)
    out = torch.empty_like(aug)
    joint = aug[0]
    out[0] = joint
    for layer in range(1, aug.shape[0]):
        joint = aug[layer] @ joint
        out[layer] = joint
    return out


# ----------------------------------------------------------------------------- all views
def attention_importance(model: nn.Module, tokenizer: Any, text: str,
                         target: Target | None = None, *, views: Sequence[str] = VIEWS,
                         scope: ScopeLike = "all", query: Query = "cls",
                         example_id: str = "", truncation: Truncation = "error",
                         max_length: int | None = None) -> list[TokenAttribution]:
    """Every requested attention view of one text, for every requested layer.

    Args:
        text: one input text.
        target: ``(output, inputs) -> Tensor[batch]``; needed by ``attn_x_grad`` only.
        views: any of ``raw``, ``rollout``, ``flow``, ``attn_x_grad``, ``norm``.
        scope: the layers to report (:mod:`attnprobe.core.scope`; default all);
            ``attn_x_grad`` always spans all layers.
        query: which row the views read (module docstring).
        example_id: carried into the results.

    Returns:
        One :class:`TokenAttribution` per (view, layer), in the order of ``views`` then
        ``layers``; ``method`` is ``"{view}@L{layer}"`` (``"attn_x_grad"`` for that view),
        ``target`` the target's ``spec`` for ``attn_x_grad`` and ``""`` for views that need
        none.
    """
    if isinstance(views, str):
        views = [views]
    views = list(views)
    unknown = [v for v in views if v not in VIEWS]
    if unknown or not views or len(set(views)) != len(views):
        raise InputError(f"views must be distinct names from {list(VIEWS)}; got {views}")
    if "attn_x_grad" in views and target is None:
        raise InputError("view 'attn_x_grad' needs a target (what the gradient is taken of)")
    if "norm" in views:
        check_norm_family(model)
    one_text(text)
    scope = Scope.parse(scope)
    maps = [m for m in extract(model, tokenizer, [text], truncation=truncation,
                               max_length=max_length) if m.kind == "self"]
    if not maps:
        raise InputError("the model has no self-attention map to read")
    amap = maps[0]
    layers = [layer for layer in amap.layers if scope.wants_layer(layer)]
    if scope.layers is not None:
        for layer in scope.layers:
            layer_position(amap, layer)
    tokens = amap.key_tokens
    results: list[TokenAttribution] = []

    def add(scores: torch.Tensor, method: str, spec: str = "") -> None:
        results.append(TokenAttribution(scores, tokens, method, spec, example_id))

    for view in views:
        if view == "raw":
            for layer in layers:
                add(raw(amap, layer, query=query), f"raw@L{layer}")
        elif view == "rollout":
            joint = rollout(amap)
            for layer in layers:
                add(read_query(joint[layer_position(amap, layer)], query), f"rollout@L{layer}")
        elif view == "flow":
            for layer in layers:
                add(flow(amap, layer=layer, query=query), f"flow@L{layer}")
        elif view == "attn_x_grad":
            relevance, grad_tokens = attn_x_grad_matrix(model, tokenizer, text, target)
            if grad_tokens != tokens:
                raise InputError("attention × gradient tokenised the text differently from the "
                                 "extracted map")
            add(read_query(relevance, query), "attn_x_grad", target_name(target))
        else:  # norm
            parts, _ = norm_parts(model, tokenizer, text, layers)
            for layer in layers:
                alpha, f = parts[layer]
                norms = (alpha * f.norm(dim=-1)[:, None, :]).mean(0)
                add(read_query(norms, query), f"norm@L{layer}")
    return results
