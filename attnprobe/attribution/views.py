"""Token importance read off the attention of one example, and the dispatch over the views.

The views registered in :data:`VIEWS` each give one score per input token (float64,
non-negative); these five, and the attention-based explanations value zeroing
(:mod:`~attnprobe.attribution.value_zeroing`) and ALTI (:mod:`~attnprobe.attribution.alti`),
each in its own module:

- ``raw`` (:func:`raw`) — one row (or the mean / max over rows) of one layer's weights, averaged
  over the scope's heads of that layer (every head by default).
- ``rollout`` (:func:`rollout`) — Abnar & Zuidema (2020): residual-augmented, head-averaged
  attention ``A_l = 0.5·mean_h A_l,h + 0.5·I`` multiplied through the layers,
  ``Ã_1 = A_1, Ã_l = A_l · Ã_{l-1}``.
- ``flow`` (:func:`flow`) — Abnar & Zuidema's attention flow: the maximum flow from one node of a
  layer to every input token through the layered graph whose capacities are the ``A_l`` above.
- ``attn_x_grad`` (:func:`attention_x_gradient`) — Chefer, Gur & Wolf (2021) generic rule:
  ``Ā_l = mean_h[(∂y/∂A_l ⊙ A_l)^+]``, ``R ← R + Ā_l·R`` from ``R = I``.
- ``norm`` (:func:`norm_based` / :func:`norm_importance`) — Kobayashi et al. (2020):
  ``‖α_ij f(x_j)‖`` with ``f(x_j) = (x_j W_V^h + b_V^h) W_O^h``, averaged over the scope's
  heads of each layer.

The scope (:mod:`attnprobe.core.scope`) chooses the layers reported by every view, and the
heads that ``raw`` and ``norm`` average. Rollout, flow and attention × gradient go through every
head of every layer, as they are defined (a layer's output mixes all its heads, and the next
layer reads that mix); the scope only picks the layers they are read at.

:func:`attention_importance` runs any of them on one text and returns
:class:`~attnprobe.types.TokenAttribution` objects named ``"{view}@L{layer}"`` (model layer
index, 0-based), or ``"attn_x_grad"``, which spans all layers; :func:`map_importance` runs the
views that need no model on a stored :class:`~attnprobe.types.AttentionMap`. A new view is one
class registered in :data:`VIEWS` (:mod:`attnprobe.attribution.view_base`).

Which query row is read (``query``): ``"auto"`` (the default: ``"last"`` for causal models,
``"cls"`` otherwise — from the model's kind, or for a stored map from ``info.causal``, else from
whether any row attends to a later key), ``"cls"`` / ``"first"`` (row 0, the ``[CLS]`` row of
BERT-like models), ``"last"`` (the last real token: for a causal LM the only row that sees the
whole text, the one that predicts the next token), ``"mean"`` (mean over rows), ``"max"`` (max
over rows, as Abnar & Zuidema's DistilBERT script does), or an int row index (negative counts
from the end).

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
    norm_based,
    norm_importance,
)
from attnprobe.attribution.targets import TargetFn
from attnprobe.attribution.view_base import VIEWS, View, ViewInput
from attnprobe.attribution.view_common import HEAD_REDUCES as HEAD_REDUCES  # re-exported
from attnprobe.attribution.view_common import QUERIES as QUERIES  # re-exported
from attnprobe.attribution.view_common import (
    HeadReduce,
    Query,
    augmented,
    check_query,
    check_stack,
    layer_position,
    map_causal,
    one_text,
    read_query,
    resolve_query,
)
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation, truncation_mode
from attnprobe.types import AttentionMap, TokenAttribution

__all__ = [
    "FLOW_MAX_TOKENS",
    "FLOW_SCALE",
    "NORM_FAMILIES",
    "VIEWS",
    "View",
    "ViewInput",
    "attention_importance",
    "attention_x_gradient",
    "build_views",
    "flow",
    "map_importance",
    "norm_based",
    "norm_importance",
    "raw",
    "rollout",
    "run_views",
]

ViewLike = str | View


# ----------------------------------------------------------------------------- map views
def raw(amap: AttentionMap, layer: int, *, head: int | Sequence[int] | None = None,
        query: Query = "auto") -> torch.Tensor:
    """Raw attention of one layer as token importance.

    Args:
        amap: one example's map.
        layer: model layer index.
        head: model head index, or several (averaged); ``None`` averages every head of the map.
        query: which row to read (module docstring).

    Returns:
        ``[key]`` float64.

    Example:
        >>> row = raw(amap, 0)     # layer 0, mean over heads, the [CLS] row (an encoder)
        >>> row.shape, round(float(row.sum()), 6)       # [key]; a row of weights sums to 1
        (torch.Size([9]), 1.0)
        >>> torch.allclose(raw(amap, 0, head=3), amap.pattern[0, 3, 0].double())  # one head
        True
    """
    if not isinstance(amap, AttentionMap):
        raise InputError(f"raw takes an AttentionMap; got {type(amap).__name__}")
    pos = layer_position(amap, layer)
    if head is None:
        matrix = amap.pattern[pos].mean(0)
    else:
        heads = [head] if isinstance(head, int) else list(head)
        matrix = amap.select(layers=[int(layer)], heads=heads).pattern[0].mean(0)
    return read_query(matrix.to(torch.float64), resolve_query(query, map_causal(amap)))


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

    Example:
        >>> joint = rollout(amap)                       # amap: [6, 12, 9, 9]
        >>> joint.shape                                 # [layer, query, key]
        torch.Size([6, 9, 9])
        >>> torch.allclose(joint.sum(-1), torch.ones(6, 9, dtype=torch.float64))
        True
        >>> a0 = 0.5 * amap.pattern[0].mean(0).double() + 0.5 * torch.eye(9).double()
        >>> torch.allclose(joint[0], a0 / a0.sum(-1, keepdim=True))   # Ã_0 = A_0
        True
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


@VIEWS.register("raw")
class RawView(View):
    """``raw@L{layer}``: the query row of the layer's weights, mean over the scope's heads."""

    name = "raw"
    summary = ("the raw row of a query (`cls`, `last`, `mean`, `max` over rows, or an index) "
               "per head or averaged over the scope's heads")

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        amap = inp.amap
        return [inp.result(raw(amap, layer, head=inp.heads(layer), query=inp.query),
                           amap.key_tokens, f"{self.name}@L{layer}") for layer in inp.layers]


@VIEWS.register("rollout")
class RolloutView(View):
    """``rollout@L{layer}``: the query row of the rollout after each layer (all heads)."""

    name = "rollout"
    summary = "attention rollout (Abnar & Zuidema, residual-augmented), through every head"

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        amap = inp.amap
        joint = rollout(amap)
        return [inp.result(read_query(joint[layer_position(amap, layer)], inp.query),
                           amap.key_tokens, f"{self.name}@L{layer}") for layer in inp.layers]


# ----------------------------------------------------------------------------- dispatch
def build_views(views: Sequence[ViewLike] | ViewLike | None, *, model: nn.Module | None = None,
                has_target: bool = True, only_readable: bool = False) -> list[View]:
    """The view objects for ``views`` (registry names or :class:`View` objects; ``None``: every
    registered view), checked before any forward: distinct names, a target where one is
    needed, and a model each view can read (``only_readable``: views the model cannot serve
    are left out instead, as long as one remains)."""
    if views is None:
        views = VIEWS.names()
    elif isinstance(views, (str, View)):
        views = [views]
    views = list(views)
    built = [VIEWS.get(v)() if isinstance(v, str) and v in VIEWS else v for v in views]
    names = [v.name if isinstance(v, View) else v for v in built]
    if not built or any(not isinstance(v, View) for v in built) or len(set(names)) != len(names):
        raise InputError(f"views must be distinct names from {VIEWS.names()} (or View "
                         f"objects); got {views}")
    for view in built:
        if view.needs_target and not has_target:
            raise InputError(f"view {view.name!r} needs a target (what the gradient is taken "
                             "of)")
    if model is None:
        return built
    readable = []
    for view in built:
        try:
            view.check(model)
        except InputError:
            if not only_readable or (view is built[-1] and not readable):
                raise
            continue
        readable.append(view)
    return readable


def run_views(views: Sequence[View], inp: ViewInput) -> list[TokenAttribution]:
    """Every view's importance of one text, in the order of ``views``; all over the same
    tokens (checked: a view that runs the model tokenises the text itself)."""
    results = [a for view in views for a in view.importance(inp)]
    if len({a.tokens for a in results}) > 1:
        named = ", ".join(f"{a.method} ({len(a.tokens)})" for a in results)
        raise InputError(f"the attention views tokenised the text differently: {named}")
    return results


def attention_importance(model: nn.Module, tokenizer: Any, text: str,
                         target: TargetFn | None = None, *,
                         views: Sequence[ViewLike] | ViewLike | None = None,
                         scope: ScopeLike = "all", query: Query = "auto",
                         example_id: str = "", truncation: Truncation = "error",
                         max_length: int | None = None) -> list[TokenAttribution]:
    """Every requested attention view of one text, for every requested layer.

    Args:
        text: one input text.
        target: ``(output, inputs) -> Tensor[batch]``; needed by ``attn_x_grad`` only.
        views: names in :data:`VIEWS` (``raw``, ``rollout``, ``flow``, ``attn_x_grad``,
            ``norm``, ``value_zeroing``, ``alti``, and any view registered since) or
            :class:`View` objects; default every registered view the model's family can serve
            (its ``check``) and, without a target, that needs none, in name order.
        scope: the layers to report (:mod:`attnprobe.core.scope`; default all), and the heads
            ``raw`` and ``norm`` average; rollout, flow and ``attn_x_grad`` run through every
            head (module docstring), and ``attn_x_grad`` spans all layers.
        query: which row the views read (module docstring).
        example_id: carried into the results.
        truncation, max_length: for a text longer than the model allows
            (:mod:`attnprobe.inputs.text`); every view sees the same tokens.

    Returns:
        One :class:`TokenAttribution` per (view, layer), in the order of ``views`` then
        layers; ``method`` is ``"{view}@L{layer}"`` (``"attn_x_grad"`` for that view),
        ``target`` the target's ``spec`` for ``attn_x_grad`` and ``""`` for views that need
        none.

    Example:
        >>> found = attention_importance(lm, lm_tok, prompt, views=["raw", "rollout"])
        >>> [a.method for a in found]                   # per view, then per layer
        ['raw@L0', 'raw@L1', 'rollout@L0', 'rollout@L1']
        >>> found[0].scores.shape           # [key]: the last token's row (a causal model)
        torch.Size([17])
        >>> [a.to_frame() for a in found][0].columns.tolist()
        ['example_id', 'method', 'target', 'position', 'token', 'score']
    """
    defaulted = views is None  # the default adapts to the model and the call; a choice does not
    if defaulted:
        views = [name for name in VIEWS.names()
                 if target is not None or not VIEWS.get(name).needs_target]
    built = build_views(views, model=model, has_target=target is not None,
                        only_readable=defaulted)
    one_text(text)
    check_query(query)
    if truncation_mode(truncation) == "skip":  # one text: there is nothing to skip it from
        truncation = "error"
    inp = ViewInput(text, Scope.parse(scope), query, target, example_id, model, tokenizer,
                    truncation, max_length)
    return run_views(built, inp)


def map_importance(amap: AttentionMap, *, views: Sequence[ViewLike] | ViewLike | None = None,
                   scope: ScopeLike = "all", query: Query = "auto",
                   example_id: str = "") -> list[TokenAttribution]:
    """The views that need no model (``raw``, ``rollout``, ``flow`` ...) on a stored map, e.g.
    one written by ``attnprobe extract``; as :func:`attention_importance` otherwise.

    Args:
        amap: a self-attention map (rollout and flow need every layer from 0).
        views: default every registered view that does not run the model.

    Example:
        >>> found = map_importance(amap, views=["raw", "rollout"], scope="layer:5")
        >>> [a.method for a in found]
        ['raw@L5', 'rollout@L5']
        >>> found[0].tokens == amap.key_tokens, found[0].scores.shape     # [key]
        (True, torch.Size([9]))
    """
    if not isinstance(amap, AttentionMap):
        raise InputError(f"map_importance takes an AttentionMap; got {type(amap).__name__}")
    if views is None:
        views = [name for name in VIEWS.names() if not VIEWS.get(name).needs_model]
    built = build_views(views)
    for view in built:
        if view.needs_model or view.needs_target:
            raise InputError(f"view {view.name!r} runs the model; use attention_importance")
    check_query(query)
    inp = ViewInput("", Scope.parse(scope), query, example_id=example_id, given_map=amap)
    return run_views(built, inp)
