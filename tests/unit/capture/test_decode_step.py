"""The lean KV-cache decoding step: equal to the models' eager functions, and not taken where
the eager function computes something else."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.gpt2 import modeling_gpt2
from transformers.models.llama import modeling_llama

import attnprobe as ap
from attnprobe.capture.decode_step import lean_step, plain_step_kwargs, same_as_eager
from tests.integration.hf_models import VOCAB, build


class _Attention(torch.nn.Module):
    num_key_value_groups = 2
    training = False


@pytest.mark.parametrize("q_len", [1, 3])
def test_lean_step_equals_the_llama_and_gpt2_eager_functions(q_len):
    g = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, q_len, 8, generator=g)
    key, value = torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)
    out, weights = lean_step(query, key, value, 0.3)
    ref_out, ref_weights = modeling_llama.eager_attention_forward(
        _Attention(), query, key, value, None, scaling=0.3)
    assert weights.shape == (2, 4, q_len, 9) and out.shape == (2, q_len, 4, 8)
    assert torch.allclose(weights, ref_weights, atol=1e-6)
    assert torch.allclose(out, ref_out, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, q_len))
    assert same_as_eager((out, weights), (ref_out, ref_weights))
    key4, value4 = key.repeat_interleave(2, 1), value.repeat_interleave(2, 1)  # no grouping
    gpt2 = modeling_gpt2.eager_attention_forward(_Attention(), query, key4, value4, None)
    assert same_as_eager(lean_step(query, key4, value4, None), gpt2)
    capped = (ref_out, torch.softmax(torch.tanh(ref_weights.log()), -1))
    assert not same_as_eager((out, weights), capped)
    assert not same_as_eager((out, weights), (ref_out, None))


def test_only_plain_attention_arguments_take_the_lean_step():
    assert plain_step_kwargs({"scaling": 0.1, "dropout": 0.0, "position_ids": None,
                              "use_cache": True, "sliding_window": None})
    for kwargs in ({"softcap": 30.0}, {"s_aux": torch.zeros(4)}, {"dropout": 0.1},
                   {"sliding_window": 4}):
        assert not plain_step_kwargs(kwargs)


def _capped(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Llama's eager function with soft-capped scores (as Gemma 2 does)."""
    key = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    scores = torch.tanh(torch.matmul(query, key.transpose(2, 3)) * scaling / 0.05) * 0.05
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _eager_forward(model, ids):
    """Eager weights ``[layer, head, T, T]`` of one forward over ``ids`` ``[1, T]``."""
    with torch.no_grad():
        model.set_attn_implementation("eager")
        try:
            ref = model(input_ids=ids, output_attentions=True).attentions
        finally:
            model.set_attn_implementation("sdpa")
    return torch.stack([a[0] for a in ref])


@pytest.mark.parametrize("capped", [False, True])
def test_captured_steps_equal_the_eager_function_the_model_has(monkeypatch, capped):
    original = modeling_llama.eager_attention_forward
    if capped:
        monkeypatch.setattr(modeling_llama, "eager_attention_forward", _capped)
    base = build("llama")
    model = transformers.LlamaForCausalLM(base.config).eval()
    model.model.load_state_dict(base.state_dict())
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), ap.capture(model) as cap:
        tokens = model.generate(prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                                pad_token_id=0)
    captured, expected = cap.maps[0].pattern, _eager_forward(model, tokens[:, :-1])
    assert captured.shape == expected.shape == (2, 4, 10, 10)
    assert torch.allclose(captured, expected, atol=1e-5)
    if capped:  # the step rows (6..9) are the capped ones, far from what lean_step gives
        monkeypatch.setattr(modeling_llama, "eager_attention_forward", original)
        uncapped = _eager_forward(model, tokens[:, :-1])
        assert (captured[..., 6:, :] - uncapped[..., 6:, :]).abs().max() > 1e-2


def test_values_of_another_head_size_are_served_like_eager():
    """DeepSeek's latent attention has value heads of another size than query/key heads."""
    g = torch.Generator().manual_seed(1)
    query, key = torch.randn(1, 4, 1, 12, generator=g), torch.randn(1, 2, 5, 12, generator=g)
    value = torch.randn(1, 2, 5, 6, generator=g)
    out, weights = lean_step(query, key, value, 0.25)
    ref_out, ref_weights = modeling_llama.eager_attention_forward(
        _Attention(), query, key, value, None, scaling=0.25)
    assert out.shape == (1, 1, 4, 6)
    assert torch.allclose(out, ref_out, atol=1e-6) and torch.allclose(weights, ref_weights,
                                                                      atol=1e-6)


def test_generation_on_deepseek_latent_attention_equals_one_forward():
    from tests.integration.causal_lms import text, word_tokenizer

    config = transformers.DeepseekV3Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=6, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    tok = word_tokenizer(bos=True)
    (found,) = ap.extract(model, tok, [text(5, 6, 7, 8)], generate=3)
    ids = tok([" ".join(found.key_tokens[1:])], return_tensors="pt")
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(**ids, output_attentions=True).attentions
    expected = torch.stack([layer[0] for layer in eager])  # [layer, head, query, key]
    assert found.pattern.shape == expected.shape
    assert torch.allclose(found.pattern, expected, atol=1e-5)
