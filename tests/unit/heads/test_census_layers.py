"""The census reads every layer with its own rule of visible keys (a model whose layers
differ: Qwen2 with a sliding window on its second layer only), in one capture per corpus."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.heads import head_census
from attnprobe.heads.scores import census_reducers, wide_scores
from tests.conftest import track
from tests.integration.causal_lms import word_tokenizer

WINDOW = 4
N_TOKENS = 10  # <s> and 9 words: longer than the window, so it binds


@pytest.fixture(scope="module")
def qwen_window():
    """Layer 0 attends to every earlier key, layer 1 to the last WINDOW only."""
    config = transformers.Qwen2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, use_sliding_window=True,
        sliding_window=WINDOW, max_window_layers=1)
    assert config.layer_types == ["full_attention", "sliding_attention"]
    torch.manual_seed(0)
    return track(transformers.Qwen2Model(config).eval()), word_tokenizer(bos=True)


TEXTS = [" ".join(f"w{4 + (3 * i + j) % 90}" for j in range(N_TOKENS - 1)) for i in range(3)]


def test_each_layer_is_read_with_its_own_visible_keys(qwen_window):
    model, tok = qwen_window
    result = ap.heads.census(model, tok, TEXTS, repeated=False, similarity=False)
    scores = result.scores().set_index(["layer", "head"]).sort_index()
    rows = np.arange(1, N_TOKENS + 1)
    expected = {0: np.mean(1 / rows), 1: np.mean(1 / np.minimum(rows, WINDOW))}
    for layer, value in expected.items():  # mean 1/(keys a row may see), by construction
        found = scores.loc[layer, "chance_weight"].to_numpy()
        assert found == pytest.approx(value, abs=1e-7)  # float32 1/n
    # the same as each layer reduced alone (the capture's Reduce part, one layer at a time)
    alone = wide_scores(ap.head_stats(model, tok, TEXTS, reducers=census_reducers(tok)))
    alone = alone.set_index(["layer", "head"]).sort_index()
    numeric = [c for c in alone.select_dtypes("number").columns if c in scores]
    assert len(numeric) > 20
    assert np.allclose(scores[numeric].to_numpy(float), alone[numeric].to_numpy(float),
                       atol=1e-6, equal_nan=True)


def test_a_corpus_is_read_in_one_capture(qwen_window, monkeypatch):
    model, tok = qwen_window
    entered = []
    capture = head_census.capture

    def counted(*args, **kwargs):
        entered.append(kwargs.get("parts"))
        return capture(*args, **kwargs)

    monkeypatch.setattr(head_census, "capture", counted)
    result = ap.heads.census(model, tok, TEXTS, batch_size=1, repeated=False)
    assert len(entered) == 1 and result.n_sentences == len(TEXTS)  # three forwards
    assert result.sums.distances.rows == 3 * N_TOKENS  # every row (fewer than 16) of each


def test_each_text_is_tokenized_once(qwen_window, monkeypatch):
    model, tok = qwen_window
    seen = []
    call = type(tok).__call__

    def counted(self, texts, *args, **kwargs):
        seen.extend(t for t in ([texts] if isinstance(texts, str) else texts) if t in TEXTS)
        return call(self, texts, *args, **kwargs)

    monkeypatch.setattr(type(tok), "__call__", counted)
    result = ap.heads.census(model, tok, TEXTS, batch_size=2, repeated=False)
    assert sorted(seen) == sorted(TEXTS)  # planning tokenized them; the batches pad those rows
    monkeypatch.undo()
    again = ap.heads.census(model, tok, TEXTS, batch_size=2, repeated=False)
    assert result.scores().equals(again.scores())
