"""Attention modules that run in unusual ways, against transformers' own eager weights:
a layer shared across depths (ALBERT), two softmaxes in one layer (differential attention),
a learned sink (GPT-OSS), hybrids with linear-attention layers (Qwen3-Next), per-layer head
counts, models with no attention weights (Mamba), and a model that ignores its mask."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

import attnprobe as ap
from attnprobe.capture.sites import site_for_path
from tests.conftest import track

IDS = torch.tensor([[5, 17, 33, 9, 61, 24], [8, 44, 71, 12, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
SIZES = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4,
             initializer_range=0.3)
DECODER = dict(**SIZES, num_key_value_heads=2, head_dim=8, num_hidden_layers=2)


def pair(config: transformers.PretrainedConfig):
    """``(model, eager_twin)``: the model as transformers builds it, and an eager twin with
    the same weights whose ``output_attentions`` is the reference."""
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(copy.deepcopy(config)).eval()
    twin = transformers.AutoModel.from_config(copy.deepcopy(config),
                                              attn_implementation="eager").eval()
    twin.load_state_dict(model.state_dict())
    return track(model), twin


def reference(twin) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return twin(input_ids=IDS, attention_mask=MASK, output_attentions=True).attentions


def captured(model, scope="all", **kwargs):
    with torch.no_grad(), ap.capture(model, scope, **kwargs) as cap:
        out = model(input_ids=IDS, attention_mask=MASK)
    return cap, out


def assert_maps_equal(maps, weights: list[torch.Tensor], stack_suffix: str = "") -> None:
    """Each map of ``maps`` (one per example) against ``weights`` (per map layer,
    ``[batch, head, query, key]``) on the example's real tokens."""
    for amap in maps:
        b = int(amap.example_id)
        real = MASK[b].bool()
        assert len(weights) == len(amap.layers)
        for i, want in enumerate(weights):
            torch.testing.assert_close(amap.pattern[i], want[b][:, real][:, :, real],
                                       atol=1e-5, rtol=0)


def test_a_layer_shared_across_depths_gives_one_layer_per_run():
    model, twin = pair(transformers.AlbertConfig(**SIZES, embedding_size=16,
                                                 num_hidden_layers=3))
    cap, _ = captured(model)
    want = reference(twin)
    assert len(want) == 3 and len(cap.maps) == 2
    assert all(amap.layers == (0, 1, 2) for amap in cap.maps)
    assert_maps_equal(cap.maps, list(want))
    paths = set(cap.runs["path"])
    assert len(paths) == 1  # one module ...
    assert list(cap.runs["call"]) == [0, 1, 2]  # ... run three times
    # a scope beyond the modules' own indices is a depth, read once the module runs again
    deep, _ = captured(model, "layer:2", stop_early=True)
    assert all(amap.layers == (2,) for amap in deep.maps)
    assert_maps_equal(deep.maps, [want[2]])
    with pytest.raises(ap.InputError, match="out of range"):
        captured(model, "layer:3")


def test_differential_attention_keeps_its_second_softmax_apart():
    model, twin = pair(transformers.DiffLlamaConfig(**DECODER))
    cap, _ = captured(model)
    want = reference(twin)
    first = [m for m in cap.maps if m.stack == "layers"]
    second = [m for m in cap.maps if m.stack == "layers#2"]
    assert len(first) == len(second) == 2
    assert_maps_equal(first, list(want))
    # the two calls share queries and keys, so their weights are equal (transformers reports
    # only the first)
    assert_maps_equal(second, list(want))


def test_a_learned_sink_keeps_its_mass():
    config = transformers.GptOssConfig(
        **DECODER, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])
    model, twin = pair(config)
    cap, _ = captured(model)
    assert_maps_equal(cap.maps, list(reference(twin)))
    for amap in cap.maps:
        assert amap.learned_sink
        rows = amap.pattern.sum(-1)
        assert (rows < 1 - 1e-3).any() and (rows <= 1 + 1e-6).all()
        torch.testing.assert_close(amap.sink_mass, 1 - rows)



def test_a_learned_sink_survives_a_round_trip_through_files(tmp_path):
    config = transformers.GptOssConfig(
        **DECODER, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])
    model, _ = pair(config)
    cap, _ = captured(model)
    loaded = ap.AttentionMap.load(cap.maps[0].save(tmp_path / "sink.npz"))
    assert loaded.learned_sink
    torch.testing.assert_close(loaded.sink_mass, cap.maps[0].sink_mass)


def test_a_hybrid_captures_its_attention_layers_indexed_as_in_the_model():
    config = transformers.Qwen3NextConfig(
        **DECODER, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16)
    model, twin = pair(config)
    cap, _ = captured(model)
    want = reference(twin)  # transformers records only the attention layers
    assert len(want) == 1
    assert all(amap.layers == (1,) for amap in cap.maps)
    assert_maps_equal(cap.maps, list(want))
    assert set(cap.runs["path"]) == {"layers.1.self_attn"}


def test_layers_with_their_own_head_counts_are_kept_apart():
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=64, initializer_range=0.3)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    two_heads = copy.deepcopy(config)
    two_heads.n_head = 2
    model.h[1].attn = transformers.models.gpt2.modeling_gpt2.GPT2Attention(two_heads,
                                                                         layer_idx=1)
    model.h[1].attn.config = model.config  # one config: one attention implementation
    model.eval()
    twin = copy.deepcopy(model)
    twin.set_attn_implementation("eager")
    track(model)
    cap, _ = captured(model)
    want = reference(twin)
    assert len(cap.maps) == 4  # per example: layer 0 (4 heads) and layer 1 (2 heads) apart
    assert {amap.layers for amap in cap.maps} == {(0,), (1,)}
    for amap in cap.maps:
        assert amap.pattern.shape[1] == (4 if amap.layers == (0,) else 2)
        assert_maps_equal([amap], [want[amap.layers[0]]])


def test_a_model_without_attention_weights_is_a_one_line_refusal():
    model = track(transformers.MambaModel(transformers.MambaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=4)).eval())
    with pytest.raises(ap.AttentionUnavailableError, match="no attention weights") as err:
        captured(model)
    assert "\n" not in str(err.value)
    assert ap.count_hooks(model) == 0


def test_a_negative_layer_index_falls_back_to_the_path():
    module = torch.nn.Linear(2, 2)
    module.layer_idx = -1
    assert site_for_path("model.layers.3.self_attn", module).layer == 3


def test_a_model_that_attends_to_padding_is_named():
    """FSMT's decoder masks padding by token id only when ``use_cache=False``: with the
    cache on, real rows give weight to padding the attention mask names."""
    config = transformers.FSMTConfig(
        langs=["en", "de"], src_vocab_size=100, tgt_vocab_size=100, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=1,
        max_position_embeddings=64, init_std=0.3)
    torch.manual_seed(0)
    model = track(transformers.FSMTModel(config).eval())
    ids = IDS.masked_fill(~MASK.bool(), 1)
    with torch.no_grad(), ap.capture(model) as cap:
        model(input_ids=ids, attention_mask=MASK, decoder_input_ids=ids,
              decoder_attention_mask=MASK)
    with pytest.raises(ap.InputError, match=r"decoder\.layers\.0\.self_attn .*does not mask them"):
        cap.maps  # noqa: B018 - the maps are built (and checked) on first read
