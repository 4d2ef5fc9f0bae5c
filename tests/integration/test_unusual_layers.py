"""Layer layouts the plain one-attention-per-layer picture misses, each against the model's
own eager ``output_attentions``: Funnel's blocks of layers (indices repeat within a block),
hybrids whose recurrent layers run no attention (Jamba), per-layer configs (dots3's head
counts per layer), and keys that are no tokens (DeepSeek-V4's compressed entries)."""

from __future__ import annotations

import pytest
import torch
import transformers
from harness import tiny_inputs as ti
from harness import tiny_models as tm

import attnprobe as ap
from attnprobe.capture import discovery
from attnprobe.capture.info import attention_sizes, model_info, model_scope
from attnprobe.errors import InputError
from tests.integration.causal_lms import text, word_tokenizer

# float32 softmax weights of the same computation, eager vs eager: equal up to rounding
WEIGHT_TOL = 16 * torch.finfo(torch.float32).eps


def _eager(twin: torch.nn.Module, inputs: dict) -> tuple:
    with torch.no_grad():
        return twin(**inputs, output_attentions=True, return_dict=True).attentions


def _captured(model: torch.nn.Module, inputs: dict, scope: str = "all") -> list:
    with torch.no_grad(), ap.capture(model, scope) as cap:
        model(**inputs)
    return cap.maps


# ---------------------------------------------------------------- Funnel (item 16)
@pytest.fixture(scope="module")
def funnel():
    config = tm.tiny_config("funnel")
    config.block_sizes = [4, 4, 4]  # the released checkpoints' blocks
    model, twin = tm.build_pair(config)
    return config, model, twin


def test_funnel_blocks_number_layers_across_blocks(funnel):
    config, model, twin = funnel
    ids = torch.arange(tm.FIRST_REAL_ID, tm.FIRST_REAL_ID + 9)[None]  # one example, no padding
    maps = _captured(model, {"input_ids": ids})
    encoder = {layer: amap.pattern[i] for amap in maps if amap.stack == "encoder.blocks"
               for i, layer in enumerate(amap.layers)}
    # the encoder's layers in the order they run: blocks[0][0..3], blocks[1][0..3], ...
    assert sorted(encoder) == list(range(sum(config.block_sizes)))
    reference = _eager(twin, {"input_ids": ids})  # encoder layers first, then the decoder's
    for layer, pattern in encoder.items():
        expected = reference[layer][0]
        assert pattern.shape == expected.shape  # pooled queries from the block's first layer
        torch.testing.assert_close(pattern, expected, atol=WEIGHT_TOL, rtol=0)
    assert attention_sizes(model)[0] == sum(config.block_sizes)


# ---------------------------------------------------------------- hybrids (item 8)
@pytest.fixture(scope="module")
def jamba_lm():
    torch.manual_seed(0)
    config = transformers.JambaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, initializer_range=0.3, use_mamba_kernels=False)
    model = transformers.JambaForCausalLM(config).eval()
    assert config.layers_block_type == ["mamba", "attention"]
    return model, word_tokenizer(bos=True)


TEXTS = [text(5, 6, 7, 8), text(9, 10, 11)]


def test_a_scope_naming_a_layer_without_attention_is_a_one_line_error(jamba_lm):
    model, tok = jamba_lm
    for scope in ("layer:0", "head:0.1", "layers:0-1"):
        with pytest.raises(InputError, match=r"layer 0 of Jamba.* no attention") as err:
            ap.extract(model, tok, TEXTS, scope=scope)
        assert "\n" not in str(err.value)
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    with pytest.raises(InputError, match="no attention"), ap.capture(model, "layer:0"):
        model(**batch)
    assert ap.count_hooks(model) == 0


def test_default_scopes_cover_the_attention_layers_only(jamba_lm):
    model, tok = jamba_lm
    swept = ap.perturb.run(model, tok, TEXTS, "ablate", sweep="head", metric="loss")
    assert sorted(set(zip(swept.layer, swept["head"], strict=True))) == [(1, h) for h in range(4)]
    knocked = ap.perturb.knockout(model, tok, TEXTS, "to:0", sweep="layer", metric="loss")
    assert set(knocked.layer) == {1}
    assert [amap.layers for amap in ap.extract(model, tok, TEXTS)] == [(1,), (1,)]
    assert str(model_scope(model, "all")) == "layer:1"
    assert str(model_scope(model, "*.2")) == "head:1.2"
    assert discovery.attention_layers(model, discovery.hf_sites(model)) == (1,)


# ---------------------------------------------------------------- per-layer configs (item 17)
def test_per_layer_head_counts_are_read_per_layer():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    values = tm.tiny_config("dots3_note_text").to_dict()
    values["per_layer_config"] = {1: {"num_attention_heads": 2, "num_key_value_heads": 2}}
    config = CONFIG_MAPPING["dots3_note_text"](**{
        k: v for k, v in values.items() if k not in ("model_type", "transformers_version")})
    assert config.is_heterogeneous  # config.num_attention_heads itself raises
    model, twin = tm.build_pair(config)
    batch = ti.make_inputs("dots3_note_text", model, config)
    assert model_info(model, implementation="sdpa").n_heads == 4  # the widest layer
    assert attention_sizes(model) == (2, 4)
    maps = _captured(model, batch.inputs)
    reference = _eager(twin, batch.inputs)
    mask = batch.masks["main"]
    for amap in maps:
        b, (layer,) = int(amap.example_id), amap.layers
        real = mask[b]
        expected = reference[layer][b][:, real][..., real]
        assert amap.pattern.shape[1] == (4, 2)[layer]
        torch.testing.assert_close(amap.pattern[0], expected, atol=WEIGHT_TOL, rtol=0)


# ---------------------------------------------------------------- appended keys (item 18)
@pytest.mark.parametrize("side", ["right", "left"])
def test_compressed_keys_are_named_and_padding_keys_stripped(side):
    config = tm.tiny_config("deepseek_v4")
    rate = config.compress_rates["compressed_sparse_attention"]
    assert config.layer_types[1] == "compressed_sparse_attention"
    model, twin = tm.build_pair(config)
    lengths = (17, 5, 12)
    ids, mask = ti.padded(lengths, tm.vocab_size(config), tm.special_ids(config), 0, side,
                          seed=1)
    inputs = {"input_ids": ids, "attention_mask": mask}
    maps = [m for m in _captured(model, inputs) if m.layers == (1,)]
    reference = _eager(twin, inputs)[1]
    width = ids.shape[1]
    assert reference.shape[-1] == width + width // rate  # tokens, then one entry per window
    for amap, n in zip(maps, lengths, strict=True):
        b, real = int(amap.example_id), mask[int(amap.example_id)].bool()
        rows = reference[b][:, real]  # [head, real query, key]
        # entries some real query attends to; by hand for each padding side:
        start = width - n if side == "left" else 0
        if side == "right":  # causal: the last real token sees the windows it completes
            seen = list(range(n // rate))
        else:  # the compressor ignores the mask: every complete window is seen
            seen = list(range(width // rate))
        assert rows[..., width:].ne(0).any(-2).any(0).nonzero().flatten().tolist() == seen
        expected = torch.cat([rows[..., :width][..., real], rows[..., width:][..., seen]], -1)
        torch.testing.assert_close(amap.pattern[0], expected, atol=WEIGHT_TOL, rtol=0)
        names = []
        for w in seen:
            inside = [p - start for p in range(w * rate, (w + 1) * rate) if start <= p < start + n]
            names.append(f"[compressed {inside[0]}-{inside[-1]}]" if inside
                         else f"[compressed {w}: padding]")
        assert list(amap.key_tokens[n:]) == names
        assert list(amap.key_tokens[:n]) == [str(i) for i in ids[b][real].tolist()]
        assert len(amap.key_tokens) == amap.pattern.shape[-1]


# ---------------------------------------------------------------- indexer-picked keys
def test_keys_an_indexer_picks_stay_the_only_keys_under_capture():
    """DeepSeek-V3.2 masks the keys its indexer did not pick only under "eager"/"sdpa";
    under the capture's implementation it hands the picks over as ``indices``. With more
    tokens than ``index_topk`` the picks matter: maps equal eager ``output_attentions`` and
    the outputs the uncaptured ones."""
    config = tm.tiny_config("deepseek_v32")
    model, twin = tm.build_pair(config)
    lengths = (17, 11, 6)
    assert max(lengths) > config.index_topk
    batch = ti.make_inputs("deepseek_v32", model, config, lengths, side="left")
    reference = _eager(twin, batch.inputs)
    with torch.no_grad():
        base = model(**batch.inputs).last_hidden_state
        eager_out = twin(**batch.inputs).last_hidden_state
        with ap.capture(model) as cap:
            captured = model(**batch.inputs).last_hidden_state
    mask = batch.masks["main"]
    for amap in cap.maps:
        b = int(amap.example_id)
        for i, layer in enumerate(amap.layers):
            expected = reference[layer][b][:, mask[b]][..., mask[b]]
            torch.testing.assert_close(amap.pattern[i], expected, atol=WEIGHT_TOL, rtol=0)
    # captured layers run eager attention: as far from SDPA as the model's own eager path
    # (4x its measured gap, plus float32 rounding of the output's scale)
    gap = (eager_out - base)[mask].abs().max().item()
    scale = base[mask].abs().max().item()
    bound = 4 * gap + 8 * torch.finfo(torch.float32).eps * scale
    assert (captured - base)[mask].abs().max().item() <= bound
