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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError
from attnprobe.extraction import _model_inputs, check_texts, encode, extract
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

Query = Literal["cls", "first", "last", "mean", "max"] | int
HeadReduce = Literal["mean", "max", "min"]
Target = Callable[[Any, dict], torch.Tensor]

VIEWS = ("raw", "rollout", "flow", "attn_x_grad", "norm")
QUERIES = ("cls", "first", "last", "mean", "max")
HEAD_REDUCES = ("mean", "max", "min")
# One max-flow per input token over a graph of (L+1)·n nodes and L·n² edges: past this many
# tokens a single flow takes minutes (use rollout instead).
FLOW_MAX_TOKENS = 256
# Capacities are the weights times FLOW_SCALE, rounded to integers (scipy's max-flow needs
# integer capacities and stores them as int32, so a capacity must stay below 2**31 - 1). Each
# capacity is then off by at most 0.5 / FLOW_SCALE = 5e-10; a flow value (a minimum cut) by at
# most that times the number of edges in the cut. Measured on MiniLM at 128 tokens (6 layers):
# <= 6e-9 relative to networkx's float max-flow (analyses/bench_flow.py), far below float32
# attention noise.
FLOW_SCALE = 10**9
# model_type -> family whose output projection norm_based knows how to slice
NORM_FAMILIES = {
    "bert": "bert", "roberta": "bert", "xlm-roberta": "bert",
    "gpt2": "gpt2",
    "llama": "llama", "mistral": "llama", "qwen2": "llama",
}


# ----------------------------------------------------------------------------- helpers
def _read_query(matrix: torch.Tensor, query: Query) -> torch.Tensor:
    """One ``[key]`` vector from a ``[query, key]`` matrix (see the module docstring)."""
    n = matrix.shape[0]
    if isinstance(query, str):
        if query in ("cls", "first"):
            return matrix[0]
        if query == "last":
            return matrix[-1]
        if query == "mean":
            return matrix.mean(0)
        if query == "max":
            return matrix.amax(0)
    elif isinstance(query, (int, np.integer)) and not isinstance(query, bool):
        if not -n <= int(query) < n:
            raise InputError(f"query row {query} out of range for {n} query tokens")
        return matrix[int(query)]
    raise InputError(f"query must be one of {list(QUERIES)} or an int row; got {query!r}")


def _query_rows(query: Query, n: int) -> list[int]:
    """The rows a query spec reads (all rows for ``mean`` / ``max``)."""
    if query in ("mean", "max"):
        return list(range(n))
    probe = torch.arange(n, dtype=torch.float64)[:, None]
    return [int(_read_query(probe, query)[0])]


def _layer_pos(amap: AttentionMap, layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
            or int(layer) not in amap.layers:
        raise InputError(f"layer {layer!r} not in this map; it has layers {list(amap.layers)}")
    return amap.layers.index(int(layer))


def _check_self(amap: AttentionMap, what: str) -> None:
    if not isinstance(amap, AttentionMap):
        raise InputError(f"{what} takes an AttentionMap; got {type(amap).__name__}")
    if amap.kind != "self" or amap.shape[2] != amap.shape[3]:
        raise InputError(f"{what} needs a self-attention map (square [query, key]); got "
                         f"kind {amap.kind!r}, shape {amap.shape}")


def _check_stack(amap: AttentionMap, what: str) -> None:
    """Rollout and flow multiply through every layer from the first one."""
    _check_self(amap, what)
    if amap.layers != tuple(range(len(amap.layers))):
        raise InputError(f"{what} needs every layer from 0 in order; this map has layers "
                         f"{list(amap.layers)} (extract with layers=None)")


def _augmented(amap: AttentionMap, *, residual: bool, head_reduce: HeadReduce) -> torch.Tensor:
    """``[layer, query, key]`` float64: heads reduced, rows renormalised, residual added."""
    if head_reduce not in HEAD_REDUCES:
        raise InputError(f"head_reduce must be one of {list(HEAD_REDUCES)}; got {head_reduce!r}")
    p = amap.pattern.to(torch.float64)
    w = {"mean": lambda: p.mean(1), "max": lambda: p.amax(1), "min": lambda: p.amin(1)}[
        head_reduce]()
    sums = w.sum(-1, keepdim=True)
    if (sums <= 0).any():
        layer, row = (sums[..., 0] <= 0).nonzero()[0].tolist()
        raise InputError(f"head_reduce={head_reduce!r} leaves query row {row} of layer "
                         f"{amap.layers[layer]} with no weight; use head_reduce='mean'")
    w = w / sums
    if residual:
        w = 0.5 * w + 0.5 * torch.eye(w.shape[-1], dtype=w.dtype)
    return w


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
    pos = _layer_pos(amap, layer)
    matrix = amap.pattern[pos].mean(0) if head is None else amap.head(layer, head)
    return _read_query(matrix.to(torch.float64), query)


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
    _check_stack(amap, "rollout")
    aug = _augmented(amap, residual=residual, head_reduce=head_reduce)
    out = torch.empty_like(aug)
    joint = aug[0]
    out[0] = joint
    for layer in range(1, aug.shape[0]):
        joint = aug[layer] @ joint
        out[layer] = joint
    return out


def _flow_graph(aug: torch.Tensor) -> Any:
    """The layered DAG as a CSR matrix of int32 capacities.

    Node ``l·n + a`` is position ``a`` after layer ``l`` (``l = 0``: the input tokens); the edge
    ``(l+1)·n + a → l·n + b`` has capacity ``round(aug[l, a, b] · FLOW_SCALE)``.
    """
    from scipy.sparse import csr_array

    n_layers, n, _ = aug.shape
    caps = np.rint(aug.numpy() * FLOW_SCALE).astype(np.int64)
    layer, a, b = np.nonzero(caps)
    size = (n_layers + 1) * n
    return csr_array((caps[layer, a, b].astype(np.int32), ((layer + 1) * n + a, layer * n + b)),
                     shape=(size, size))


def _flows(graph: Any, n: int, node_layer: int, row: int) -> np.ndarray:
    """Max-flow from node ``(node_layer, row)`` to each input node, normalised to sum 1."""
    from scipy.sparse.csgraph import maximum_flow

    source = node_layer * n + row
    values = np.array([maximum_flow(graph, source, sink).flow_value for sink in range(n)],
                      dtype=np.float64)
    return values / values.sum()


def flow(amap: AttentionMap, *, layer: int, query: Query = "cls") -> torch.Tensor:
    """Attention flow (Abnar & Zuidema 2020) from one position of ``layer`` to the input tokens.

    The graph has ``(L+1)·n`` nodes (the inputs, then every position after each layer); the
    edge from position ``a`` after layer ``l`` to position ``b`` before it has capacity
    ``A_l[a, b]`` (residual-augmented head-mean attention, as in :func:`rollout`). Importance
    of input ``v`` is the maximum flow from node ``(layer, query)`` to ``v``; the ``n`` flows
    are normalised to sum 1. The graph is built once; each flow is one
    ``scipy.sparse.csgraph.maximum_flow`` (Dinic) on integer capacities (``FLOW_SCALE``: the
    rounding moves a flow by ~1e-8 at most on real maps). ``query="mean"`` / ``"max"`` run it
    from every row, n times the cost.

    At the first layer the only paths are the direct edges, so flow equals the residual-
    augmented row, i.e. ``rollout(amap)[0, query]``, for every query (up to the rounding).

    Args:
        amap: a self-attention map holding layers ``0..L-1`` in order, at most
            ``FLOW_MAX_TOKENS`` tokens.
        layer: model layer index whose output position is the source.
        query: the source row (module docstring).

    Returns:
        ``[key]`` float64 summing to 1.
    """
    _check_stack(amap, "flow")
    n = amap.shape[-1]
    if n > FLOW_MAX_TOKENS:
        raise InputError(f"attention flow is limited to {FLOW_MAX_TOKENS} tokens (one max-flow "
                         f"per token over an (L+1)·n-node graph); this map has {n}: use rollout")
    pos = _layer_pos(amap, layer)
    rows = _query_rows(query, n)
    aug = _augmented(amap, residual=True, head_reduce="mean")[: pos + 1]
    graph = _flow_graph(aug)
    flows = torch.from_numpy(np.stack([_flows(graph, n, pos + 1, r) for r in rows]))
    return _read_query(flows, "max" if query == "max" else "mean")


# ----------------------------------------------------------------------------- model views
def _one_text(text: str) -> list[str]:
    if not isinstance(text, str):
        raise InputError(f"text must be one string; got {type(text).__name__}")
    return check_texts([text])


def _self_sites(sites: Sequence[Site]) -> list[Site]:
    """Self-attention sites of the first stack (the encoder of encoder-decoder models), by
    layer."""
    own = [s for s in sites if s.kind == "self"]
    if not own:
        raise InputError("the model has no self-attention site to read")
    stack = min(own, key=lambda s: (s.side != "main", s.layer)).stack
    return sorted((s for s in own if s.stack == stack), key=lambda s: s.layer)


def _target_name(target: Any) -> str:
    return str(getattr(target, "spec", "custom"))


def _require_grad_on_embeddings(model: nn.Module, stack: ExitStack) -> None:
    """A frozen model (no parameter requires grad) still needs a graph through the attention:
    make the input embeddings require grad for this call (hook removed by ``stack``)."""
    if any(p.requires_grad for p in model.parameters()):
        return
    getter = getattr(model, "get_input_embeddings", None)
    embeddings = getter() if callable(getter) else None
    if not isinstance(embeddings, nn.Module):
        return

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.detach().requires_grad_(True)

    stack.callback(embeddings.register_forward_hook(hook).remove)


def _attn_x_grad_matrix(model: nn.Module, tokenizer: Any, text: str,
                        target: Target) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Chefer's relevance matrix ``R`` ``[query, key]`` (float64) and the tokens."""
    texts = _one_text(text)
    if not callable(target):
        raise InputError(f"target must be callable (output, inputs) -> Tensor[batch]; got "
                         f"{type(target).__name__}")
    if torch.is_inference_mode_enabled():
        raise InputError("attention × gradient needs gradients; call it outside "
                         "torch.inference_mode()")
    batch = encode(model, tokenizer, texts)
    inputs = _model_inputs(model, batch)
    with torch.enable_grad():
        with ExitStack() as stack:
            _require_grad_on_embeddings(model, stack)
            cap = stack.enter_context(capture(model, keep=False, live=True))
            output = model(**inputs)
        fixed = getattr(target, "fixed", None)
        if callable(fixed):  # e.g. next-token: pick the token from this forward, then score
            target = fixed(output, inputs)
        score = target(output, inputs)
        if not isinstance(score, torch.Tensor) or score.numel() != 1:
            raise InputError(f"target {_target_name(target)!r} must return one value for the "
                             f"one text; got {getattr(score, 'shape', type(score).__name__)}")
        if not cap.live:
            raise InputError("no attention was captured during the forward")
        sites = _self_sites(list(cap.live[0]))
        patterns = [cap.live[0][s] for s in sites]
        if not score.requires_grad or not any(p.requires_grad for p in patterns):
            raise InputError(f"no gradient reaches the attention from target "
                             f"{_target_name(target)!r} (detached output, or weights without "
                             "autograd support)")
        grads = torch.autograd.grad(score.sum(), patterns, allow_unused=True)
    n = patterns[0].shape[-1]
    if any(p.shape[-2] != p.shape[-1] for p in patterns):  # e.g. a single learned query
        raise InputError("attention × gradient rolls relevance through square token-to-token "
                         "self-attention; this model's attention has "
                         f"{patterns[0].shape[-2]} query row(s) over {n} keys (use the raw view)")
    relevance = torch.eye(n, dtype=torch.float64)
    for pattern, grad in zip(patterns, grads, strict=True):
        if grad is None:  # this layer does not influence the target
            continue
        a = pattern.detach()[0].to("cpu", torch.float64)
        g = grad[0].to("cpu", torch.float64)
        cam = (g * a).clamp(min=0).mean(0)  # [query, key]
        relevance = relevance + cam @ relevance
    if not torch.isfinite(relevance).all():
        raise InputError(f"attention × gradient for target {_target_name(target)!r} is not "
                         "finite (NaN or inf gradients)")
    ids = batch["input_ids"][0].tolist()
    tokens = tuple(tokenizer.convert_ids_to_tokens(ids)) \
        if hasattr(tokenizer, "convert_ids_to_tokens") else tuple(str(i) for i in ids)
    return relevance, tokens


def attention_x_gradient(model: nn.Module, tokenizer: Any, text: str, target: Target, *,
                         query: Query = "cls") -> torch.Tensor:
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, generic rule).

    For every self-attention layer in order, ``Ā_l = mean_h[(∂y/∂A_l ⊙ A_l)^+]`` with ``y`` the
    target, and ``R ← R + Ā_l·R`` starting from ``R = I``; the importance is row ``query`` of
    ``R``. The gradients come from :func:`attnprobe.capture` (``live=True``) and
    ``torch.autograd.grad`` (so no parameter's ``.grad`` is touched). A model with every
    parameter frozen works too (the input embeddings are made to require grad for the call).

    Args:
        text: one input text.
        target: ``(output, inputs) -> Tensor[batch]``, the value explained (e.g. a class logit);
            its ``.spec`` (if any) names it.
        query: which row of ``R`` to read.

    Returns:
        ``[key]`` float64 (``R`` includes the identity, so the query's own token has >= 1).

    Raises:
        InputError: inside ``torch.inference_mode()``, or when no gradient reaches the attention.
    """
    relevance, _ = _attn_x_grad_matrix(model, tokenizer, text, target)
    return _read_query(relevance, query)


def _out_projection(model: nn.Module, site: Site) -> tuple[torch.Tensor, bool]:
    """The attention output projection of a site: its weight and whether it is stored
    ``[in, out]`` (GPT-2's Conv1D) rather than ``[out, in]`` (``nn.Linear``)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    family = NORM_FAMILIES.get(model_type)
    supported = ", ".join(sorted(NORM_FAMILIES))
    if family is None:
        raise InputError(f"norm-based importance needs the attention output projection, which "
                         f"attnprobe resolves for model types {supported}; got "
                         f"{model_type or type(model).__name__}")
    path = {"bert": site.path.rsplit(".", 1)[0] + ".output.dense",
            "gpt2": site.path + ".c_proj", "llama": site.path + ".o_proj"}[family]
    try:
        module = model.get_submodule(path)
    except AttributeError:
        module = None
    weight = getattr(module, "weight", None)
    conv = type(module).__name__ == "Conv1D"
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 \
            or not (isinstance(module, nn.Linear) or conv):
        raise InputError(f"expected the {family} attention output projection at {path!r} "
                         f"(model type {model_type}); not found")
    return weight, conv


def _norm_parts(model: nn.Module, tokenizer: Any, text: str, layers: Sequence[int]
                ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], tuple[str, ...]]:
    """Per layer: weights ``α`` ``[head, query, key]`` and ``f(x_j)`` ``[head, key, d_model]``
    (float64, CPU), and the tokens. One forward for all layers."""
    texts = _one_text(text)
    layers = list(layers)
    batch = encode(model, tokenizer, texts)
    inputs = _model_inputs(model, batch)
    with torch.no_grad(), capture(model, layers=layers, values=True,
                                  tokenizer=tokenizer) as cap:
        model(**inputs)
    if not cap.values:
        raise InputError("no value vectors were captured (norm-based importance needs a "
                         "transformers model)")
    sites = {s.layer: s for s in _self_sites(list(cap.values[0]))}
    amap = next(m for m in cap.maps if m.kind == "self" and m.stack == sites[layers[0]].stack)
    parts = {}
    for layer in layers:
        site = sites[layer]
        weight, conv = _out_projection(model, site)
        value = cap.values[0][site][0].to("cpu", torch.float64)  # [head, key, d_head]
        n_heads, _, d_head = value.shape
        w = weight.detach().to("cpu", torch.float64)
        w = w if conv else w.T  # [in = head·d_head, out = d_model]
        if w.shape[0] != n_heads * d_head:
            raise InputError(f"output projection of {site.path} takes {w.shape[0]} inputs, not "
                             f"{n_heads} heads × {d_head}")
        f = torch.einsum("hkd,hdo->hko", value, w.reshape(n_heads, d_head, -1))
        alpha = amap.pattern[amap.layers.index(layer)].to(torch.float64)
        parts[layer] = (alpha, f)
    return parts, amap.key_tokens


def norm_based(model: nn.Module, tokenizer: Any, text: str, *, layer: int) -> torch.Tensor:
    """Norm-based attention (Kobayashi et al. 2020): ``‖α_ij f(x_j)‖ = α_ij·‖f(x_j)‖``.

    ``f(x_j) = (x_j W_V^h + b_V^h) W_O^h``: the value vector of key ``j`` in head ``h`` (from
    :func:`attnprobe.capture`, ``values=True``) times the head's ``d_head`` input slice of the
    attention output projection; the output bias is excluded (it does not depend on ``j``).
    Supported: BERT-like models (bert, roberta, xlm-roberta: ``...attention.output.dense``),
    GPT-2 (``attn.c_proj``), LLaMA / Mistral / Qwen2 (``self_attn.o_proj``).

    Returns:
        ``[head, query, key]`` float64.

    Raises:
        InputError: for any other model.
    """
    _out_family_check(model)
    parts, _ = _norm_parts(model, tokenizer, text, [layer])
    alpha, f = parts[layer]
    return alpha * f.norm(dim=-1)[:, None, :]


def _out_family_check(model: nn.Module) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in NORM_FAMILIES:
        raise InputError(f"norm-based importance resolves the attention output projection of "
                         f"model types {', '.join(sorted(NORM_FAMILIES))} only; got "
                         f"{model_type or type(model).__name__}")


def norm_importance(model: nn.Module, tokenizer: Any, text: str, *, layer: int,
                    head: int | None = None, query: Query = "cls") -> torch.Tensor:
    """One query row of :func:`norm_based` (heads averaged unless ``head`` is given).

    Returns:
        ``[key]`` float64.
    """
    norms = norm_based(model, tokenizer, text, layer=layer)
    if head is not None:
        if isinstance(head, bool) or not isinstance(head, int) \
                or not 0 <= head < norms.shape[0]:
            raise InputError(f"head {head!r} out of range (0..{norms.shape[0] - 1})")
        return _read_query(norms[head], query)
    return _read_query(norms.mean(0), query)


# ----------------------------------------------------------------------------- all views
def attention_importance(model: nn.Module, tokenizer: Any, text: str,
                         target: Target | None = None, *, views: Sequence[str] = VIEWS,
                         layers: Sequence[int] | None = None, query: Query = "cls",
                         example_id: str = "") -> list[TokenAttribution]:
    """Every requested attention view of one text, for every requested layer.

    Args:
        text: one input text.
        target: ``(output, inputs) -> Tensor[batch]``; needed by ``attn_x_grad`` only.
        views: any of ``raw``, ``rollout``, ``flow``, ``attn_x_grad``, ``norm``.
        layers: model layer indices (default: all); ``attn_x_grad`` always spans all layers.
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
        _out_family_check(model)
    _one_text(text)
    maps = [m for m in extract(model, tokenizer, [text]) if m.kind == "self"]
    if not maps:
        raise InputError("the model has no self-attention map to read")
    amap = maps[0]
    if layers is None:
        layers = list(amap.layers)
    else:
        layers = [layers] if isinstance(layers, int) else list(layers)
        for layer in layers:
            _layer_pos(amap, layer)
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
                add(_read_query(joint[_layer_pos(amap, layer)], query), f"rollout@L{layer}")
        elif view == "flow":
            for layer in layers:
                add(flow(amap, layer=layer, query=query), f"flow@L{layer}")
        elif view == "attn_x_grad":
            relevance, grad_tokens = _attn_x_grad_matrix(model, tokenizer, text, target)
            if grad_tokens != tokens:
                raise InputError("attention × gradient tokenised the text differently from the "
                                 "extracted map")
            add(_read_query(relevance, query), "attn_x_grad", _target_name(target))
        else:  # norm
            parts, _ = _norm_parts(model, tokenizer, text, layers)
            for layer in layers:
                alpha, f = parts[layer]
                norms = (alpha * f.norm(dim=-1)[:, None, :]).mean(0)
                add(_read_query(norms, query), f"norm@L{layer}")
    return results
