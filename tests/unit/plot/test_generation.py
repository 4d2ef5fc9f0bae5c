"""generation_attention draws the generation steps of a map and their share on the prompt.

The step that wrote generated token ``k`` is the query row before it (``prompt_length - 1 +
k``): its logits chose that token. Each heatmap row is such a step, labelled with the token it
wrote.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.errors import InputError
from attnprobe.plot import generation_attention
from attnprobe.types import AttentionMap, ModelInfo
from tests.integration.causal_lms import causal_lm, text
from tests.unit.plot.drawn import mesh, render, ticks

TOKENS = ("<s>", "a", "b", "c", "d", "e")
PROMPT = 3
STEPS = slice(PROMPT - 1, len(TOKENS) - 1)  # the rows that wrote c, d, e


@pytest.fixture
def generated() -> AttentionMap:
    """2 layers x 2 heads over 6 tokens, causal, the last 3 generated."""
    scores = torch.randn(2, 2, 6, 6, generator=torch.Generator().manual_seed(5))
    causal = torch.ones(6, 6).tril().bool()
    pattern = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    info = ModelInfo("hand", "hand", n_layers=2, n_heads=2, causal=True)
    return AttentionMap(pattern, TOKENS, TOKENS, layers=(0, 1), info=info,
                        prompt_length=PROMPT)


def lines(ax, gid):
    return [line for line in ax.get_lines() if line.get_gid() == gid]


def test_one_head_draws_its_generated_rows_and_their_prompt_share(generated):
    fig = generation_attention(generated, layer=1, head=0)
    render(fig)
    heat, share = fig.axes[0], fig.axes[1]
    expected = generated.pattern[1, 0, STEPS].numpy()
    np.testing.assert_allclose(mesh(heat), expected, rtol=1e-6)
    assert ticks(heat, "x") == list(TOKENS) and ticks(heat, "y") == \
        list(TOKENS[PROMPT:])
    assert heat.get_title() == "L1H0"
    (end,) = lines(heat, "prompt-end")
    assert end.get_xdata()[0] == PROMPT
    (dots,) = lines(share, "on-prompt")
    np.testing.assert_allclose(dots.get_xdata(), expected[:, :PROMPT].sum(-1), rtol=1e-6)
    assert len(dots.get_xdata()) == len(TOKENS) - PROMPT


def test_heads_are_combined_by_mean_or_max(generated):
    rows = generated.pattern[:, :, STEPS].numpy()
    mean = mesh(generation_attention(generated).axes[0])
    np.testing.assert_allclose(mean, rows.mean(axis=(0, 1)), rtol=1e-6)
    layer0 = generation_attention(generated, layer=0, reduce="max")
    np.testing.assert_allclose(mesh(layer0.axes[0]), rows[0].max(axis=0), rtol=1e-6)
    (dots,) = lines(layer0.axes[1], "on-prompt")  # the share is read off the mean
    np.testing.assert_allclose(dots.get_xdata(), rows[0].mean(0)[:, :PROMPT].sum(-1),
                               rtol=1e-6)


def test_a_map_of_one_forward_or_a_bad_choice_is_a_one_line_error(generated):
    plain = AttentionMap(generated.pattern, TOKENS, TOKENS, layers=(0, 1), info=generated.info)
    with pytest.raises(InputError, match="no generated tokens"):
        generation_attention(plain)
    with pytest.raises(InputError, match="needs layer"):
        generation_attention(generated, head=1)
    with pytest.raises(InputError, match="layer 5 was not captured"):
        generation_attention(generated, layer=5)
    with pytest.raises(InputError, match="reduce must be one of"):
        generation_attention(generated, reduce="median")
    with pytest.raises(InputError, match="AttentionMap"):
        generation_attention([generated])


def test_a_map_from_extract_generate_is_drawn():
    model, tok = causal_lm("llama")
    (found,) = ap.extract(model, tok, [text(3, 4, 5, 6)], generate=4)
    fig = generation_attention(found, layer=0, head=1)
    render(fig)
    expected = found.head(0, 1)[found.prompt_length - 1:-1].numpy()
    assert mesh(fig.axes[0]).shape == (4, len(found.key_tokens))
    np.testing.assert_allclose(mesh(fig.axes[0]), expected, rtol=1e-6)


def test_each_row_is_labelled_with_the_token_its_step_wrote():
    """Greedy generation: the logits of the query row a heatmap row shows chose the token on
    its tick label (one forward over the final sequence, independent of the plot). The
    first step reads only the prompt."""
    model, tok = causal_lm("llama")
    (found,) = ap.extract(model, tok, [text(3, 4, 5, 6)], generate=4)
    fig = generation_attention(found, layer=1, head=0)
    render(fig)
    heat, share = fig.axes[0], fig.axes[1]
    labels = ticks(heat, "y")
    assert labels == list(found.query_tokens[found.prompt_length:])
    ids = torch.tensor([tok.convert_tokens_to_ids(list(found.query_tokens))])
    with torch.no_grad():
        chosen = model(ids).logits[0].argmax(-1)  # [query]: the token each row predicts
    rows = [found.prompt_length - 1 + k for k in range(len(labels))]
    assert tok.convert_ids_to_tokens(chosen[rows].tolist()) == labels
    np.testing.assert_allclose(mesh(heat), found.head(1, 0)[rows].numpy(), rtol=1e-6)
    (dots,) = lines(share, "on-prompt")
    assert dots.get_xdata()[0] == pytest.approx(1.0, abs=1e-6)
