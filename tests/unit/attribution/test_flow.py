"""Attention flow: by construction at the first layer, and against networkx max-flow."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch

from attnprobe.attribution import attention_flow, view_common, views
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, ModelInfo


def make_map(pattern: torch.Tensor) -> AttentionMap:
    n_layers, n_heads, n, _ = pattern.shape
    tokens = tuple(f"t{i}" for i in range(n))
    return AttentionMap(pattern, tokens, tokens, tuple(range(n_layers)),
                        ModelInfo("test", "test", n_layers, n_heads, False))


def random_map(n_layers: int, n_heads: int, n: int, *, sharp: float = 3.0,
               seed: int = 0) -> AttentionMap:
    gen = torch.Generator().manual_seed(seed)
    return make_map(torch.softmax(sharp * torch.randn(n_layers, n_heads, n, n, generator=gen),
                                  -1))


def networkx_flow(amap: AttentionMap, layer: int, row: int) -> np.ndarray:
    """Abnar & Zuidema's construction (attention_graph_util.py), float capacities."""
    p = amap.pattern.double().mean(1).numpy()
    n_layers, n, _ = p.shape
    aug = p + np.eye(n)
    aug = aug / aug.sum(-1, keepdims=True)
    graph = nx.DiGraph()
    for lay in range(1, n_layers + 1):
        for a in range(n):
            for b in range(n):
                graph.add_edge(lay * n + a, (lay - 1) * n + b, capacity=aug[lay - 1, a, b])
    source = (layer + 1) * n + row
    values = np.array([nx.maximum_flow_value(graph, source, v,
                                             flow_func=nx.algorithms.flow.edmonds_karp)
                       for v in range(n)])
    return values / values.sum()


def test_flow_at_the_first_layer_is_the_residual_augmented_row_for_every_query():
    # the only paths from a layer-1 node to the inputs are its direct edges, so flow equals
    # rollout's first layer (0.5·mean_h A + 0.5·I) row by row, up to the integer rounding
    amap = random_map(3, 2, 7)
    augmented = 0.5 * amap.pattern.double()[0].mean(0) + 0.5 * torch.eye(7, dtype=torch.float64)
    first = views.rollout(amap)[0]
    for row in range(7):
        got = views.flow(amap, layer=0, query=row)
        assert torch.allclose(got, augmented[row], atol=1e-8)
        assert torch.allclose(got, first[row], atol=1e-8)


def test_flow_equals_a_networkx_max_flow_on_a_small_random_graph():
    amap = random_map(3, 2, 5, seed=1)
    for layer in (1, 2):
        for row in (0, 3):
            ours = views.flow(amap, layer=layer, query=row).numpy()
            reference = networkx_flow(amap, layer, row)
            np.testing.assert_allclose(ours, reference, atol=1e-7)
    # deeper flows differ from rollout (bottleneck paths, not products)
    assert not torch.allclose(views.flow(amap, layer=2), views.rollout(amap)[2, 0], atol=1e-3)


def test_flow_rows_sum_to_one_and_mean_max_combine_every_row():
    amap = random_map(2, 3, 6, seed=2)
    rows = torch.stack([views.flow(amap, layer=1, query=r) for r in range(6)])
    assert torch.allclose(rows.sum(-1), torch.ones(6, dtype=torch.float64), atol=1e-12)
    assert (rows >= 0).all()
    assert torch.allclose(views.flow(amap, layer=1, query="mean"), rows.mean(0))
    assert torch.allclose(views.flow(amap, layer=1, query="max"), rows.amax(0))
    assert torch.equal(views.flow(amap, layer=1, query="last"), rows[-1])
    assert torch.equal(views.flow(amap, layer=1, query="cls"), rows[0])


def test_capacities_fit_scipys_int32():
    amap = make_map(torch.eye(4).expand(2, 1, 4, 4).clone())  # weights of exactly 1
    graph = attention_flow.flow_graph(
        view_common.augmented(amap, residual=True, head_reduce="mean"))
    assert graph.dtype == np.int32 and graph.data.max() == views.FLOW_SCALE < 2**31 - 1
    assert torch.allclose(views.flow(amap, layer=1, query=2),
                          torch.eye(4, dtype=torch.float64)[2])


def test_flow_refuses_long_inputs_and_partial_stacks():
    n = views.FLOW_MAX_TOKENS + 1
    long = make_map(torch.full((1, 1, n, n), 1.0 / n))
    with pytest.raises(InputError, match=str(views.FLOW_MAX_TOKENS)):
        views.flow(long, layer=0)
    amap = random_map(3, 1, 4)
    with pytest.raises(InputError, match="every layer from 0"):
        views.flow(amap.select(layers=[1, 2]), layer=2)
    with pytest.raises(InputError, match="layer 7"):
        views.flow(amap, layer=7)
    with pytest.raises(InputError, match="query"):
        views.flow(amap, layer=0, query="middle")


def test_flow_of_uniform_attention_is_uniform_beyond_the_query_token():
    n = 4
    amap = make_map(torch.full((2, 1, n, n), 1.0 / n))
    got = views.flow(amap, layer=0, query=1)
    expected = torch.full((n,), 0.5 / n, dtype=torch.float64)
    expected[1] += 0.5
    assert torch.allclose(got, expected, atol=1e-8)
    assert math.isclose(float(got.sum()), 1.0, abs_tol=1e-12)
