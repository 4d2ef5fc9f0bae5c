"""Attention flow (Abnar & Zuidema 2020): the maximum flow from one node of a layer to every
input token through the layered graph whose capacities are the residual-augmented,
head-averaged attention ``A_l = 0.5·mean_h A_l,h + 0.5·I``.

Each flow is one ``scipy.sparse.csgraph.maximum_flow`` on integer capacities; the query spec
is described in :mod:`attnprobe.attribution.views`. Registered as the ``flow`` view; like
rollout it runs through every head of every layer up to the one it is read at.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnprobe.attribution.view_base import VIEWS, View, ViewInput
from attnprobe.attribution.view_common import (
    Query,
    augmented,
    check_stack,
    layer_position,
    map_causal,
    query_rows,
    read_query,
    resolve_query,
)
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, TokenAttribution

__all__ = ["FLOW_MAX_TOKENS", "FLOW_SCALE", "FlowView", "flow", "flow_graph"]

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


def flow_graph(aug: torch.Tensor) -> Any:
    """The layered DAG as a CSR matrix of int32 capacities.

    Node ``l·n + a`` is position ``a`` after layer ``l`` (``l = 0``: the input tokens); the edge
    ``(l+1)·n + a → l·n + b`` has capacity ``round(aug[l, a, b] · FLOW_SCALE)``, with ``aug``
    the ``[layer, query, key]`` residual-augmented weights
    (:func:`~attnprobe.attribution.view_common.augmented`).
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


def flow(amap: AttentionMap, *, layer: int, query: Query = "auto") -> torch.Tensor:
    """Attention flow (Abnar & Zuidema 2020) from one position of ``layer`` to the input tokens.

    The graph has ``(L+1)·n`` nodes (the inputs, then every position after each layer); the
    edge from position ``a`` after layer ``l`` to position ``b`` before it has capacity
    ``A_l[a, b]`` (residual-augmented head-mean attention, as in
    :func:`~attnprobe.attribution.views.rollout`). Importance
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
        query: the source row (the views module docstring).

    Returns:
        ``[key]`` float64 summing to 1.

    Example:
        >>> importance = flow(amap, layer=0)   # [key], from the [CLS] node after layer 0
        >>> importance.shape
        torch.Size([9])
        >>> torch.allclose(importance, ap.attribution.rollout(amap)[0, 0], atol=1e-6)
        True
    """
    check_stack(amap, "flow")
    n = amap.shape[-1]
    if n > FLOW_MAX_TOKENS:
        raise InputError(f"attention flow is limited to {FLOW_MAX_TOKENS} tokens (one max-flow "
                         f"per token over an (L+1)·n-node graph); this map has {n}: use rollout")
    pos = layer_position(amap, layer)
    query = resolve_query(query, map_causal(amap))
    rows = query_rows(query, n)
    aug = augmented(amap, residual=True, head_reduce="mean")[: pos + 1]
    graph = flow_graph(aug)
    flows = torch.from_numpy(np.stack([_flows(graph, n, pos + 1, r) for r in rows]))
    return read_query(flows, "max" if query == "max" else "mean")


@VIEWS.register("flow")
class FlowView(View):
    """``flow@L{layer}``: attention flow from the query node after each layer."""

    name = "flow"
    summary = ("attention flow (Abnar & Zuidema; max-flow with scipy's solver, ~10,000× "
               "faster per pair than networkx), through every head")

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        amap = inp.amap
        return [inp.result(flow(amap, layer=layer, query=inp.query), amap.key_tokens,
                           f"{self.name}@L{layer}") for layer in inp.layers]
