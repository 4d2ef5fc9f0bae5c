"""QueryPooling (seed 000's minimal attention) and the ``pooling`` reference model: the seed's
worked example recomputed from the formula, padding, hooks, capture and input errors."""

from __future__ import annotations

import math

import pytest
import torch

import attnprobe
import attnprobe.models.pooling  # registers "pooling"
from attnprobe.errors import InputError
from attnprobe.models import build_reference
from attnprobe.models.pooling import PoolingClassifier, QueryPooling
from tests.conftest import track

# seed 000, "可运行实现": the same four states, two queries
STATES = [[1.0, 0.0, 0.2], [0.1, 1.2, 0.0], [0.8, 0.2, 0.9], [0.0, 0.5, 1.1]]
QUERIES = {"focus_first_feature": [1.0, 0.0, 0.0], "focus_third_feature": [0.0, 0.0, 1.0]}


def _by_hand(query: list[float], states: list[list[float]]) -> tuple[list[float], list[float]]:
    """scores_i = q·h_i, weights = softmax(scores), context = Σ w_i h_i, in plain Python."""
    scores = [sum(q * h for q, h in zip(query, state, strict=True)) for state in states]
    exps = [math.exp(s) for s in scores]
    weights = [e / sum(exps) for e in exps]
    context = [sum(w * state[j] for w, state in zip(weights, states, strict=True))
               for j in range(len(states[0]))]
    return weights, context


@pytest.mark.parametrize("name", list(QUERIES))
def test_seed_worked_example_matches_the_formula(name):
    weights, context = _by_hand(QUERIES[name], STATES)
    got_context, got_weights = QueryPooling()(torch.tensor([QUERIES[name]]), torch.tensor([STATES]))
    assert torch.allclose(got_weights[0], torch.tensor(weights), atol=1e-6)
    assert torch.allclose(got_context[0], torch.tensor(context), atol=1e-6)


def test_two_queries_over_the_same_states_focus_on_different_positions():
    pool = QueryPooling()
    states = torch.tensor([STATES, STATES])  # [2, 4, 3]
    queries = torch.tensor(list(QUERIES.values()))  # [2, 3]
    context, weights = pool(queries, states)
    # by construction: feature 0 is largest at state 0, feature 2 at state 3
    assert weights.argmax(dim=1).tolist() == [0, 3]
    assert not torch.allclose(context[0], context[1])


def test_seed_batched_shapes_and_scaling():
    g = torch.Generator().manual_seed(0)
    states, query = torch.randn(2, 5, 8, generator=g), torch.randn(2, 8, generator=g)
    scores = torch.bmm(states, query.unsqueeze(2)).squeeze(2)  # the seed's batched form
    for scaled, divisor in ((False, 1.0), (True, math.sqrt(8))):
        context, weights = QueryPooling(scaled=scaled)(query, states)
        assert weights.shape == (2, 5) and context.shape == (2, 8)
        expected = torch.softmax(scores / divisor, dim=1)
        assert torch.allclose(weights, expected, atol=1e-6)
        assert torch.allclose(context, torch.bmm(expected.unsqueeze(1), states).squeeze(1),
                              atol=1e-6)


def test_padded_keys_get_exactly_zero_and_padding_changes_nothing():
    g = torch.Generator().manual_seed(1)
    states, query = torch.randn(1, 3, 4, generator=g), torch.randn(1, 4, generator=g)
    junk = 100 * torch.randn(1, 2, 4, generator=g)  # padding states with huge scores
    pool = QueryPooling()
    context, weights = pool(query, states)
    for padded, mask in ((torch.cat([states, junk], 1), [[1, 1, 1, 0, 0]]),
                         (torch.cat([junk, states], 1), [[0, 0, 1, 1, 1]])):
        mask = torch.tensor(mask)
        got_context, got_weights = pool(query, padded, mask)
        assert torch.all(got_weights[mask == 0] == 0)
        assert torch.allclose(got_weights[mask == 1], weights[0], atol=1e-6)
        assert torch.allclose(got_context, context, atol=1e-6)


def test_hooks_see_single_query_rows_and_an_edit_changes_the_context():
    pool = track(QueryPooling())
    states, query = torch.tensor([STATES]), torch.tensor([QUERIES["focus_first_feature"]])
    seen = {}
    handles = [pool.hook_scores.register_forward_hook(lambda m, a, o: seen.__setitem__("s", o)),
               pool.hook_pattern.register_forward_hook(lambda m, a, o: seen.__setitem__("p", o))]
    try:
        pool(query, states)
    finally:
        for h in handles:
            h.remove()
    assert seen["s"].shape == seen["p"].shape == (1, 1, 1, 4)
    assert torch.allclose(seen["s"][0, 0, 0], torch.tensor(STATES) @ torch.tensor([1.0, 0, 0]))

    one_hot = torch.tensor([0.0, 0.0, 0.0, 1.0]).view(1, 1, 1, 4)
    handle = pool.hook_pattern.register_forward_hook(lambda m, a, o: one_hot)
    try:
        context, weights = pool(query, states)
    finally:
        handle.remove()
    assert torch.equal(weights[0], one_hot.flatten())
    assert torch.allclose(context[0], torch.tensor(STATES[3]))


def test_bad_inputs_raise_input_error():
    pool = QueryPooling()
    with pytest.raises(InputError, match="query must be"):
        pool(torch.zeros(1, 3), torch.zeros(1, 4, 2))
    with pytest.raises(InputError, match="key_padding_mask"):
        pool(torch.zeros(1, 3), torch.zeros(1, 4, 3), torch.ones(1, 5))
    with pytest.raises(InputError, match="no key"):
        pool(torch.zeros(2, 3), torch.zeros(2, 4, 3), torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]))


def test_reference_model_padding_invariance_and_capture():
    model, tok = attnprobe.load_model("ref:pooling")
    model = track(model)
    assert isinstance(model, PoolingClassifier) and model.attnprobe_name == "pooling"
    assert (model.config.n_layers, model.config.n_heads, model.config.causal) == (1, 1, False)
    texts = ["the cat sat on the mat", "a dog"]
    alone = [model(**tok([t])) for t in texts]
    for side in ("left", "right"):
        logits = model(**tok(texts, padding_side=side))
        assert logits.shape == (2, 2)
        assert torch.allclose(logits, torch.cat(alone), atol=1e-6)

    batch = tok(texts, padding_side="left")
    with attnprobe.capture(model, tokenizer=tok, scores=True) as cap:
        model(**batch)
    assert len(cap.maps) == 2
    short = cap.maps[1]
    assert short.shape == (1, 1, 1, 3) and short.kind == "self"
    assert short.key_tokens == ("[BOS]", "a", "dog")
    assert torch.allclose(short.pattern.sum(-1), torch.ones(1, 1, 1))
    assert torch.allclose(short.pattern, torch.softmax(short.scores, dim=-1), atol=1e-6)
    assert build_reference("pooling", seed=1)[0].query.ne(model.query).any()


def test_capture_with_right_padding():
    model, tok = build_reference("pooling")
    model = track(model)
    with attnprobe.capture(model, tokenizer=tok) as cap:
        model(**tok(["the cat sat on the mat", "a dog"], padding_side="right"))
    assert cap.maps[1].shape == (1, 1, 1, 3)
    assert cap.maps[1].query_tokens == ("[query 0]",)  # a learned query, not a token
    assert cap.maps[1].key_tokens == ("[BOS]", "a", "dog")


def test_float_ids_are_a_clear_error():
    model, _ = build_reference("pooling")
    with pytest.raises(InputError, match="integer tensor"):
        model(input_ids=torch.tensor([[2.0, 3.0, 4.0]]))
