"""Value zeroing (Mohebbi et al. 2023) against references computed independently.

The models run in float64 so that the batched recompute of one layer and a full forward agree
to rounding: a cosine distance ``d`` moved by a relative error ``ε`` in the outputs changes by
about ``ε·sqrt(2d)``, i.e. relative ``ε·sqrt(2/d)``; with ``ε ≈ 1e-15`` and ``d >= 1e-8`` that is
below 1e-10, the tolerance used (a float32 model would need ~1e-3 on small distances).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers

from attnprobe.attribution import VIEWS, attention_importance
from attnprobe.attribution.value_zeroing import ValueZeroingView, value_zeroing, zeroing_rollout
from attnprobe.errors import InputError
from tests.conftest import track
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert_config

TEXT = "the cat sat on a mat"
TOL = 1e-10


def tok():
    return bert_tokenizer(bert_vocab())


def bert(layers: int = 1) -> transformers.BertModel:
    torch.manual_seed(0)
    config = tiny_bert_config(bert_vocab(), attn_implementation="eager")
    config.num_hidden_layers = layers
    return track(transformers.BertModel(config).double().eval())


def gpt2(n_tok: int) -> transformers.GPT2Model:
    torch.manual_seed(1)
    config = transformers.GPT2Config(vocab_size=n_tok, n_embd=16, n_layer=1, n_head=2,
                                     n_positions=32, initializer_range=0.3,
                                     attn_implementation="eager")
    return track(transformers.GPT2Model(config).double().eval())


def llama(n_tok: int, kv_heads: int = 2) -> transformers.LlamaModel:
    """SDPA: LLaMA's eager attention takes the softmax in float32 even for a float64 model, and
    a float32 rounding flip between the batched and the looped run would move a score ~1e-7."""
    torch.manual_seed(2)
    config = transformers.LlamaConfig(vocab_size=n_tok, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=kv_heads, initializer_range=0.3,
                                      attn_implementation="sdpa")
    return track(transformers.LlamaModel(config).double().eval())


def ids(t) -> torch.Tensor:
    return t([TEXT], return_tensors="pt")["input_ids"]


def cos_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``1 − a·b / (‖a‖‖b‖)`` per row, written out."""
    return 1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def rows_normalised(c: torch.Tensor) -> torch.Tensor:
    return c / c.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------- hand maths
def bert_layer_by_hand(m: transformers.BertModel, x: torch.Tensor, zero: int | None,
                       head: int | None = None) -> torch.Tensor:
    """One BERT (post-norm) layer on ``x`` ``[seq, d]``, value of token ``zero`` zeroed (in
    every head, or in ``head``)."""
    layer = m.encoder.layer[0]
    att = layer.attention.self
    n_heads, d = m.config.num_attention_heads, x.shape[-1]
    dh = d // n_heads
    q = x @ att.query.weight.T + att.query.bias
    k = x @ att.key.weight.T + att.key.bias
    v = x @ att.value.weight.T + att.value.bias
    if zero is not None:
        v = v.clone()
        cols = slice(None) if head is None else slice(head * dh, (head + 1) * dh)
        v[zero, cols] = 0
    heads = []
    for h in range(n_heads):
        s = slice(h * dh, (h + 1) * dh)
        weights = torch.softmax(q[:, s] @ k[:, s].T / math.sqrt(dh), dim=-1)
        heads.append(weights @ v[:, s])
    ctx = torch.cat(heads, dim=-1)
    out = layer.attention.output
    eps = m.config.layer_norm_eps
    h1 = F.layer_norm(ctx @ out.dense.weight.T + out.dense.bias + x, (d,),
                      out.LayerNorm.weight, out.LayerNorm.bias, eps)
    inner = F.gelu(h1 @ layer.intermediate.dense.weight.T + layer.intermediate.dense.bias)
    o = layer.output
    return F.layer_norm(inner @ o.dense.weight.T + o.dense.bias + h1, (d,),
                        o.LayerNorm.weight, o.LayerNorm.bias, eps)


def gpt2_block_by_hand(m: transformers.GPT2Model, x: torch.Tensor, zero: int | None
                       ) -> torch.Tensor:
    """GPT-2's (pre-norm) block on ``x`` ``[seq, d]``, value of token ``zero`` zeroed."""
    blk = m.h[0]
    n_heads, (n, d) = m.config.n_head, x.shape
    dh, eps = d // n_heads, m.config.layer_norm_epsilon
    a = F.layer_norm(x, (d,), blk.ln_1.weight, blk.ln_1.bias, eps)
    qkv = a @ blk.attn.c_attn.weight + blk.attn.c_attn.bias  # Conv1D: [in, out]
    q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:].clone()
    if zero is not None:
        v[zero] = 0
    later = torch.ones(n, n, dtype=torch.bool).triu(1)
    heads = []
    for h in range(n_heads):
        s = slice(h * dh, (h + 1) * dh)
        scores = (q[:, s] @ k[:, s].T / math.sqrt(dh)).masked_fill(later, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[:, s])
    h1 = x + torch.cat(heads, -1) @ blk.attn.c_proj.weight + blk.attn.c_proj.bias
    b = F.layer_norm(h1, (d,), blk.ln_2.weight, blk.ln_2.bias, eps)
    inner = F.gelu(b @ blk.mlp.c_fc.weight + blk.mlp.c_fc.bias, approximate="tanh")
    return h1 + inner @ blk.mlp.c_proj.weight + blk.mlp.c_proj.bias


def by_hand(layer_fn, x: torch.Tensor, **kw) -> torch.Tensor:
    """``[query, key]``: cosine distance of each output row when key ``j`` is zeroed, rows
    normalised."""
    original = layer_fn(x, None, **kw)
    c = torch.stack([cos_distance(original, layer_fn(x, j, **kw)) for j in range(x.shape[0])],
                    dim=1)
    return rows_normalised(c)


def test_bert_one_layer_equals_the_maths_written_out():
    m, t = bert(), tok()
    with torch.no_grad():
        x = m.embeddings(input_ids=ids(t))[0]
        expected = by_hand(lambda x, j: bert_layer_by_hand(m, x, j), x)
    found = value_zeroing(m, t, TEXT)
    assert found.layers == (0,) and found.scores.shape == (1, *expected.shape)
    torch.testing.assert_close(found.scores[0], expected, rtol=TOL, atol=TOL)


def test_bert_per_head_zeroes_one_head_only():
    m, t = bert(), tok()
    with torch.no_grad():
        x = m.embeddings(input_ids=ids(t))[0]
        expected = torch.stack([by_hand(lambda x, j, h=h: bert_layer_by_hand(m, x, j, h), x)
                                for h in range(2)])
    found = value_zeroing(m, t, TEXT, per="head")
    torch.testing.assert_close(found.scores[0], expected, rtol=TOL, atol=TOL)


def test_gpt2_one_layer_equals_the_maths_written_out():
    t = tok()
    m = gpt2(len(t))
    input_ids = ids(t)
    with torch.no_grad():
        x = (m.wte(input_ids) + m.wpe(torch.arange(input_ids.shape[1])))[0]
        expected = by_hand(lambda x, j: gpt2_block_by_hand(m, x, j), x)
    found = value_zeroing(m, t, TEXT)
    torch.testing.assert_close(found.scores[0], expected, rtol=TOL, atol=TOL)
    later = torch.ones_like(expected, dtype=torch.bool).triu(1)
    assert float(found.scores[0][later].abs().max()) <= TOL  # causal: no later key counts


# ----------------------------------------------------------------------------- the paper's loop
def looped(m, input_ids: torch.Tensor, block: torch.nn.Module, value: torch.nn.Module,
           cols: slice) -> torch.Tensor:
    """Mohebbi et al.'s procedure, one full forward per zeroed token: a plain hook zeroes the
    value projection's row ``j`` (columns ``cols``); the block's output is read by a hook."""
    outputs: list[torch.Tensor] = []
    keep = block.register_forward_hook(lambda mod, a, out: outputs.append(
        (out if isinstance(out, torch.Tensor) else out[0])[0].detach()))
    zero: list[int] = []

    def zero_row(mod, a, out):
        if zero:
            out = out.clone()
            out[0, zero[0], cols] = 0
        return out

    hook = value.register_forward_hook(zero_row)
    try:
        with torch.no_grad():
            m(input_ids=input_ids, use_cache=False)
            for j in range(input_ids.shape[1]):
                zero[:] = [j]
                m(input_ids=input_ids, use_cache=False)
    finally:
        keep.remove()
        hook.remove()
    original = outputs[0]
    c = torch.stack([cos_distance(original, o) for o in outputs[1:]], dim=1)
    return rows_normalised(c)


def test_llama_layout_equals_the_looped_reference():
    t = tok()
    m = llama(len(t))
    layer = m.layers[0]
    expected = looped(m, ids(t), layer, layer.self_attn.v_proj, slice(None))
    found = value_zeroing(m, t, TEXT, batch_size=3)  # chunks of 3 copies: 8 tokens, 3 runs
    torch.testing.assert_close(found.scores[0], expected, rtol=TOL, atol=TOL)


def test_two_layer_bert_rollout_view_reads_the_product():
    m, t = bert(layers=2), tok()
    per_layer = torch.stack([looped(m, ids(t), m.encoder.layer[i],
                                    m.encoder.layer[i].attention.self.value, slice(None))
                             for i in range(2)])
    found = value_zeroing(m, t, TEXT)
    torch.testing.assert_close(found.scores, per_layer, rtol=TOL, atol=TOL)
    product = per_layer[1] @ per_layer[0]  # the paper's rollout, no residual term
    torch.testing.assert_close(zeroing_rollout(per_layer)[1], product, rtol=0, atol=1e-15)
    views = attention_importance(m, t, TEXT, views=["value_zeroing"])
    assert [a.method for a in views] == ["value_zeroing@L0", "value_zeroing@L1"]
    torch.testing.assert_close(views[1].scores, product[0], rtol=TOL, atol=TOL)  # [CLS] row
    one = attention_importance(m, t, TEXT, views=[ValueZeroingView(aggregate="layer")],
                               scope="layer:1")
    torch.testing.assert_close(one[0].scores, per_layer[1, 0], rtol=TOL, atol=TOL)


def test_per_head_view_reads_the_scope_heads_matrix():
    m, t = bert(layers=2), tok()
    looped_h1 = looped(m, ids(t), m.encoder.layer[1], m.encoder.layer[1].attention.self.value,
                       slice(8, 16))  # head 1 of 2, d_head 8
    one = attention_importance(m, t, TEXT, views=[ValueZeroingView(per="head")],
                               scope="head:1.1", query=3)
    assert [a.method for a in one] == ["value_zeroing@L1"]
    torch.testing.assert_close(one[0].scores, looped_h1[3], rtol=TOL, atol=TOL)


def test_batch_size_and_given_inputs_do_not_change_the_scores():
    m, t = bert(layers=2), tok()
    one = value_zeroing(m, t, TEXT, batch_size=1).scores
    torch.testing.assert_close(value_zeroing(m, t, TEXT).scores, one, rtol=TOL, atol=TOL)
    encoded = dict(t([TEXT], return_tensors="pt"))
    given = value_zeroing(m, t, "", inputs=encoded)
    torch.testing.assert_close(given.scores, one, rtol=TOL, atol=TOL)
    assert given.tokens == tuple(t.convert_ids_to_tokens(encoded["input_ids"][0].tolist()))


# ----------------------------------------------------------------------------- refusals
def test_view_is_discovered():
    assert VIEWS.get("value_zeroing") is ValueZeroingView


def test_grouped_query_attention_refuses_per_head():
    t = tok()
    with pytest.raises(InputError, match="grouped-query"):
        value_zeroing(llama(len(t)), t, TEXT, per="head")


def test_unsupported_family_training_mode_and_bad_options_are_refused():
    t = tok()
    opt = transformers.OPTModel(transformers.OPTConfig(
        vocab_size=len(t), hidden_size=16, num_hidden_layers=1, ffn_dim=32,
        num_attention_heads=2, word_embed_proj_dim=16)).eval()
    with pytest.raises(InputError, match="model types"):
        value_zeroing(opt, t, TEXT)
    m = bert()
    m.train()
    with pytest.raises(InputError, match="eval"):
        value_zeroing(m, t, TEXT)
    m.eval()
    with pytest.raises(InputError, match="aggregate='layer'"):
        ValueZeroingView(per="head", aggregate="rollout")
    with pytest.raises(InputError, match="per must be"):
        value_zeroing(m, t, TEXT, per="token")
    with pytest.raises(InputError, match="batch_size"):
        value_zeroing(m, t, TEXT, batch_size=0)


def test_padded_or_batched_inputs_are_refused():
    """A padded position is no token of the text: its row and column would be scored (or a
    row left all-zero), so value zeroing takes one unpadded ``[1, seq]`` text."""
    m, t = bert(), tok()
    padded = t([TEXT, "the cat"], padding=True, return_tensors="pt")
    with pytest.raises(InputError, match="one unpadded text") as caught:
        value_zeroing(m, t, "", inputs=dict(padded))
    assert "\n" not in str(caught.value)
    one = {k: v[1:] for k, v in padded.items()}  # "the cat" and its right padding
    left = {k: v.flip(-1) for k, v in one.items()}  # the same, padded on the left
    for inputs in (one, left):
        with pytest.raises(InputError, match="one unpadded text"):
            value_zeroing(m, t, "", inputs=inputs)


def electra(n_tok: int) -> transformers.ElectraModel:
    """Weights wide enough that every distance is >= 1e-8 (module docstring: tolerance)."""
    torch.manual_seed(3)
    config = transformers.ElectraConfig(vocab_size=n_tok, embedding_size=16, hidden_size=16,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=32,
                                        initializer_range=0.3, attn_implementation="eager")
    return track(transformers.ElectraModel(config).double().eval())


def distilbert(n_tok: int) -> transformers.DistilBertModel:
    torch.manual_seed(4)
    config = transformers.DistilBertConfig(vocab_size=n_tok, dim=16, n_layers=1, n_heads=2,
                                           hidden_dim=32, max_position_embeddings=32,
                                           initializer_range=0.3, attn_implementation="eager")
    return track(transformers.DistilBertModel(config).double().eval())


@pytest.mark.parametrize("kind", ["electra", "distilbert"])
def test_other_post_norm_encoders_equal_the_looped_reference(kind):
    t = tok()
    if kind == "electra":  # BERT's layer under another model type
        m = electra(len(t))
        layer = m.encoder.layer[0]
        value = layer.attention.self.value
    else:  # its own block: attention.v_lin, sa_layer_norm, ffn, output_layer_norm
        m = distilbert(len(t))
        layer = m.transformer.layer[0]
        value = layer.attention.v_lin
    expected = looped(m, ids(t), layer, value, slice(None))
    found = value_zeroing(m, t, TEXT, batch_size=3)
    torch.testing.assert_close(found.scores[0], expected, rtol=TOL, atol=TOL)
    half = looped(m, ids(t), layer, value, slice(8, 16))  # head 1 of 2
    by_head = value_zeroing(m, t, TEXT, per="head", heads=[1]).scores[0, 0]
    torch.testing.assert_close(by_head, half, rtol=TOL, atol=TOL)
    ValueZeroingView().check(m)


def test_compare_runs_the_view_on_the_text_it_encoded():
    """compare hands the view the text it encoded itself (``inputs``, unpadded: not refused);
    the scores equal the view run on the text alone."""
    from attnprobe.attribution import compare
    from tests.helpers import tiny_bert_classifier

    model, t = tiny_bert_classifier()
    texts = ["the cat sat on a mat", "a big red dog"]
    found = compare(model, t, texts, "class:1", methods=["saliency"],
                    views=["value_zeroing"]).attributions
    for example, text in enumerate(texts):
        alone = attention_importance(model, t, text, views=["value_zeroing"])
        got = [a for a in found if a.example_id == str(example)
               and a.method.startswith("value_zeroing")]
        assert [a.method for a in got] == [a.method for a in alone]
        for a, b in zip(got, alone, strict=True):
            torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)
