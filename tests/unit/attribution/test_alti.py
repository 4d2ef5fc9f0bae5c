"""ALTI (Ferrando et al. 2022) against a one-layer BERT decomposed by hand in plain torch, the
run-time sum check on BERT / GPT-2 / LLaMA layouts, rollout, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from attnprobe.attribution.alti import (
    ALTI_TOLERANCE,
    alti,
    alti_layers,
    alti_matrix,
    iter_alti_layers,
    rollout,
)
from attnprobe.attribution.view_base import VIEWS
from attnprobe.attribution.views import attention_importance
from attnprobe.errors import InputError
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert, tiny_bert_config

TEXT = "the cat sat on a mat"
# float32 model, float64 reference: a few float32 roundings of O(1) numbers per entry
F32 = 50 * torch.finfo(torch.float32).eps


def one_layer_bert(vocab: dict[str, int]) -> transformers.BertModel:
    torch.manual_seed(1)
    config = tiny_bert_config(vocab, attn_implementation="eager")
    config.num_hidden_layers = 1
    return track(transformers.BertModel(config).eval())


def tiny_gpt2(vocab: dict[str, int]) -> transformers.GPT2Model:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=len(vocab),
                                     n_positions=64, bos_token_id=2, eos_token_id=3)
    return track(transformers.GPT2Model(config).eval())


def tiny_distilbert(vocab: dict[str, int]) -> transformers.DistilBertModel:
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=len(vocab), dim=16, n_layers=2,
                                           n_heads=2, hidden_dim=32)
    return track(transformers.DistilBertModel(config).eval())


def tiny_electra(vocab: dict[str, int], layers: int = 2) -> transformers.ElectraModel:
    """ELECTRA's discriminator body is BERT's layer under another model type (embedding size =
    hidden size: no projection between them)."""
    torch.manual_seed(0)
    config = transformers.ElectraConfig(vocab_size=len(vocab), embedding_size=16, hidden_size=16,
                                        num_hidden_layers=layers, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=64,
                                        attn_implementation="eager")
    return track(transformers.ElectraModel(config).eval())


def tiny_llama(vocab: dict[str, int]) -> transformers.LlamaModel:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=32, vocab_size=len(vocab),
                                      max_position_embeddings=64, bos_token_id=2,
                                      eos_token_id=3)
    return track(transformers.LlamaModel(config).eval())


def hand_proximity(parts: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The paper's normalised proximity, written out: ``[query, key]``."""
    n = parts.shape[0]
    c = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            c[i, j] = max(0.0, float(y[i].abs().sum() - (y[i] - parts[i, j]).abs().sum()))
        c[i] /= c[i].sum()
    return c


def hand_bert_layer(model: transformers.BertModel, ids: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One BERT layer's attention block, decomposed in float64: ``T [query, key, d]``,
    ``bias [query, d]`` and the block's output ``y [query, d]`` (computed as the model
    defines it: LayerNorm(dense(softmax(q kᵀ / √d) v) + x))."""
    layer = model.encoder.layer[0]
    sa, out = layer.attention.self, layer.attention.output
    d = lambda t: t.detach().double()  # noqa: E731
    with torch.no_grad():
        x = d(model.embeddings(input_ids=ids)[0])  # [n, 16]
    n, width = x.shape
    heads, d_head = sa.num_attention_heads, sa.attention_head_size

    def proj(lin: torch.nn.Linear) -> torch.Tensor:  # [head, n, d_head]
        return (x @ d(lin.weight).T + d(lin.bias)).reshape(n, heads, d_head).transpose(0, 1)

    q, k, v = proj(sa.query), proj(sa.key), proj(sa.value)
    alpha = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d_head), -1)  # [head, n, n]
    w_o = d(out.dense.weight).T.reshape(heads, d_head, width)  # [head, d_head, d]
    b_o = d(out.dense.bias)
    u = torch.zeros(n, n, width, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            for h in range(heads):
                u[i, j] += alpha[h, i, j] * (v[h, j] @ w_o[h])
            if i == j:
                u[i, j] += x[i]
    pre = u.sum(1) + b_o
    sigma = torch.sqrt(pre.var(-1, unbiased=False) + out.LayerNorm.eps)
    gamma, beta = d(out.LayerNorm.weight), d(out.LayerNorm.bias)
    y = (pre - pre.mean(-1, keepdim=True)) / sigma[:, None] * gamma + beta
    parts = (u - u.mean(-1, keepdim=True)) / sigma[:, None, None] * gamma
    bias = (b_o - b_o.mean()) / sigma[:, None] * gamma + beta
    return parts, bias, y


def test_one_layer_bert_equals_the_hand_decomposition():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = one_layer_bert(vocab)
    ids = tok([TEXT], return_tensors="pt")["input_ids"]
    parts, bias, y = hand_bert_layer(model, ids)
    # the hand block is the model's own block (its output is the layer's attention output)
    with torch.no_grad():
        x = model.embeddings(input_ids=ids)
        own = model.encoder.layer[0].attention(x)[0][0].double()
    assert torch.allclose(y, own, rtol=0, atol=F32 * own.abs().max())

    (found,), tokens = alti_layers(model, tok, TEXT)
    assert tokens == tuple(tok.convert_ids_to_tokens(ids[0].tolist()))
    scale = y.abs().max()
    assert torch.allclose(found.parts, parts, rtol=0, atol=F32 * scale)
    assert torch.allclose(found.bias, bias, rtol=0, atol=F32 * scale)
    assert torch.allclose(found.output, y, rtol=0, atol=F32 * scale)
    assert found.gap <= ALTI_TOLERANCE

    expected = hand_proximity(parts, y)
    (rolled,) = alti_matrix([found])
    assert torch.allclose(rolled, expected, rtol=0, atol=1e-5)
    row = alti(model, tok, TEXT)  # an encoder: the [CLS] row
    assert torch.allclose(row, expected[0], rtol=0, atol=1e-5)
    assert math.isclose(float(row.sum()), 1.0, abs_tol=1e-12)


def test_one_layer_electra_equals_the_hand_decomposition():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = tiny_electra(vocab, layers=1)
    VIEWS.get("alti")().check(model)
    ids = tok([TEXT], return_tensors="pt")["input_ids"]
    parts, bias, y = hand_bert_layer(model, ids)  # the same attribute names as BERT's
    (found,), _ = alti_layers(model, tok, TEXT)
    scale = y.abs().max()
    assert torch.allclose(found.parts, parts, rtol=0, atol=F32 * scale)
    assert torch.allclose(found.bias, bias, rtol=0, atol=F32 * scale)
    assert torch.allclose(found.output, y, rtol=0, atol=F32 * scale)
    assert torch.allclose(alti(model, tok, TEXT), hand_proximity(parts, y)[0], rtol=0,
                          atol=1e-5)


def test_one_layer_gpt2_equals_the_hand_decomposition():
    """Pre-norm: ``y_i = x_i + Σ_j Σ_h α_hij (LN(x_j) W_V^h + b_V^h) W_O^h + b_O``, causal."""
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    torch.manual_seed(2)
    model = track(transformers.GPT2Model(transformers.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=len(vocab), n_positions=64,
        bos_token_id=2, eos_token_id=3, attn_implementation="eager")).eval())
    ids = tok([TEXT], return_tensors="pt")["input_ids"]
    block = model.h[0]
    d = lambda t: t.detach().double()  # noqa: E731
    with torch.no_grad():
        x = d(model.wte(ids)[0] + model.wpe(torch.arange(ids.shape[1])))
    n, width = x.shape
    heads, d_head = 2, 8
    ln = block.ln_1
    xn = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False)[:, None]
                                                     + ln.eps) * d(ln.weight) + d(ln.bias)
    qkv = xn @ d(block.attn.c_attn.weight) + d(block.attn.c_attn.bias)  # Conv1D: [in, out]
    q, k, v = (t.reshape(n, heads, d_head).transpose(0, 1) for t in qkv.split(width, -1))
    scores = q @ k.transpose(1, 2) / math.sqrt(d_head)
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), -math.inf)
    alpha = torch.softmax(scores, -1)
    w_o = d(block.attn.c_proj.weight).reshape(heads, d_head, width)
    b_o = d(block.attn.c_proj.bias)
    parts = torch.zeros(n, n, width, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            for h in range(heads):
                parts[i, j] += alpha[h, i, j] * (v[h, j] @ w_o[h])
        parts[i, i] += x[i]
    y = parts.sum(1) + b_o

    (found,), _ = alti_layers(model, tok, TEXT)
    scale = y.abs().max()
    assert torch.allclose(found.parts, parts, rtol=0, atol=F32 * scale)
    assert torch.allclose(found.output, y, rtol=0, atol=F32 * scale)
    assert torch.allclose(found.bias, b_o.expand(n, -1), rtol=0, atol=0)
    expected = hand_proximity(parts, y)
    assert float(expected.triu(1).abs().max()) == 0.0  # no token contributes to an earlier one
    assert torch.allclose(alti(model, tok, TEXT), expected[-1], rtol=0, atol=1e-5)  # last row


def built(kind: str):
    """``(model, tokenizer, text)`` of one layout: post-norm BERT / DistilBERT, pre-norm
    GPT-2, LLaMA with grouped-query attention, or attnprobe's reference induction model
    (hook points)."""
    if kind == "ref":
        from attnprobe import load_model

        model, tok = load_model("ref:induction")
        return model, tok, "t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02"
    vocab = bert_vocab()
    make = {"bert": tiny_bert, "distilbert": tiny_distilbert, "electra": tiny_electra,
            "gpt2": tiny_gpt2, "llama": tiny_llama}[kind]
    return make(vocab), bert_tokenizer(vocab), TEXT


@pytest.mark.parametrize("kind", ["bert", "distilbert", "electra", "gpt2", "llama", "ref"])
def test_parts_sum_to_the_layer_output(kind):
    model, tok, text = built(kind)
    layers, tokens = alti_layers(model, tok, text)
    assert [one.layer for one in layers] == [0, 1]
    for one in layers:
        n, width = len(tokens), one.output.shape[-1]
        assert one.parts.shape == (n, n, width) and one.bias.shape == (n, width)
        rebuilt = one.parts.sum(1) + one.bias
        assert torch.allclose(rebuilt, one.output, rtol=0,
                              atol=ALTI_TOLERANCE * one.output.abs().max())
        assert one.gap <= ALTI_TOLERANCE
    rolled = alti_matrix(layers)[-1]
    assert torch.allclose(rolled.sum(-1), torch.ones(len(tokens), dtype=torch.float64))
    if kind not in ("bert", "distilbert", "electra"):  # causal: nothing mixed into the past
        assert float(rolled.triu(1).abs().max()) == 0.0


def test_rollout_multiplies_the_layer_matrices():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = tiny_bert(vocab)
    layers, _ = alti_layers(model, tok, TEXT)
    c0, c1 = (hand_proximity(one.parts, one.output) for one in layers)
    r0, r1 = alti_matrix(layers)
    assert torch.allclose(r0, c0, rtol=0, atol=1e-12)
    assert torch.allclose(r1, c1 @ c0, rtol=0, atol=1e-12)
    assert torch.allclose(r1.sum(-1), torch.ones(r1.shape[0], dtype=torch.float64))
    assert torch.allclose(alti(model, tok, TEXT, layer=0), c0[0], rtol=0, atol=1e-12)


def test_a_decomposition_that_does_not_add_up_is_an_error():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = tiny_bert(vocab)
    dense = model.encoder.layer[1].attention.output.dense
    # scaled: not the map its weights describe (a constant shift would be centred away)
    handle = dense.register_forward_hook(lambda m, a, out: 1.5 * out)
    try:
        with pytest.raises(InputError, match="does not add up"):
            alti_layers(model, tok, TEXT)
    finally:
        handle.remove()


def test_refusals():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = tiny_bert(vocab)
    model.train()
    try:
        with pytest.raises(InputError, match="eval"):
            alti(model, tok, TEXT)
    finally:
        model.eval()
    torch.manual_seed(0)
    albert = track(transformers.AlbertModel(transformers.AlbertConfig(
        vocab_size=len(vocab), embedding_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32)).eval())
    with pytest.raises(InputError, match=r"ALTI supports .* albert is neither") as caught:
        VIEWS.get("alti")().check(albert)
    assert "\n" not in str(caught.value)


def test_the_view_runs_through_attention_importance():
    vocab = bert_vocab()
    tok = bert_tokenizer(vocab)
    model = tiny_bert(vocab)
    found = attention_importance(model, tok, TEXT, views=["alti"])
    assert [a.method for a in found] == ["alti@L0", "alti@L1"]
    layers, _ = alti_layers(model, tok, TEXT)
    rolled = alti_matrix(layers)
    for attribution, matrix in zip(found, rolled, strict=True):
        assert torch.equal(attribution.scores, matrix[0])
    lm = tiny_gpt2(vocab)
    (last,) = attention_importance(lm, tok, TEXT, views=["alti"], scope="layer:1")
    assert last.method == "alti@L1"
    assert torch.equal(last.scores, alti_matrix(alti_layers(lm, tok, TEXT)[0])[1][-1])


def test_layers_stream_one_at_a_time_and_padding_is_refused():
    model, tok, text = built("gpt2")
    found, tokens = iter_alti_layers(model, tok, text)
    assert not isinstance(found, list) and len(tokens) == 8  # made as read; [CLS] … [SEP]
    rolled = rollout(found)
    assert list(rolled) == [0, 1]
    listed = alti_matrix(alti_layers(model, tok, text)[0])
    assert all(torch.equal(rolled[k], listed[k]) for k in (0, 1))
    with pytest.raises(InputError, match="not a self-attention layer"):
        alti(model, tok, text, layer=5)
    padded = tok([text, "the cat"], padding=True, return_tensors="pt")
    with pytest.raises(InputError, match="one unpadded text"):
        iter_alti_layers(model, tok, "", inputs=padded)
    one = {k: v[1:] for k, v in padded.items()}  # "the cat" with its padding
    with pytest.raises(InputError, match="one unpadded text"):
        iter_alti_layers(model, tok, "", inputs=one)


def test_compare_reads_the_alti_view():
    """compare runs the view on the text it encoded itself (``inputs``), one row per layer."""
    from attnprobe.attribution import compare
    from tests.helpers import tiny_bert_classifier

    model, tok = tiny_bert_classifier()
    texts = ["the cat sat on a mat", "a big red dog ran"]
    table = compare(model, tok, texts, "class:1", methods=["saliency"], views=["alti"]).table
    assert set(table["view"]) == {"alti"} and set(table["layer"]) == {0, 1}


def test_blocks_of_rows_give_the_same_layers():
    """A memory cap splits each layer into blocks of query rows: the parts and the rollout
    are those of whole layers."""
    model, tok, text = built("bert")
    whole = alti_layers(model, tok, text)[0]
    n = whole[0].parts.shape[0]
    found, _ = iter_alti_layers(model, tok, text, part_bytes=3 * n * 16 * 8)  # 3 rows
    blocks = list(found)
    assert [(b.layer, b.first_row) for b in blocks] == [(0, 0), (0, 3), (0, 6), (1, 0),
                                                        (1, 3), (1, 6)]
    for layer in whole:
        mine = [b for b in blocks if b.layer == layer.layer]
        # float64 sums of the same float32 inputs: equal up to float64 rounding
        scale = 1e-12 * float(layer.output.abs().max())
        assert torch.allclose(torch.cat([b.parts for b in mine]), layer.parts, rtol=0, atol=scale)
        assert torch.equal(torch.cat([b.output for b in mine]), layer.output)
    rolled = rollout(blocks)
    assert all(torch.allclose(rolled[k], r, rtol=0, atol=1e-12)
               for k, r in zip((0, 1), alti_matrix(whole), strict=True))
