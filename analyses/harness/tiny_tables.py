"""Per model type, what the generic tiny-config rules of :mod:`harness.tiny_models` cannot
express: config overrides (:data:`OVERRIDES`) and inputs beyond ids and masks
(:data:`EXTRA_INPUTS`: a function of the batch so far and the config, returning keyword
arguments to add; a None value removes one). One entry per type; each says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

InputsFn = Callable[[dict[str, Any], Any], dict[str, Any]]


def _boxes(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """Valid layout boxes ``[batch, seq, 4]`` (x0 <= x1, y0 <= y1 inside the 2-D table)."""
    ids = inputs["input_ids"]
    g = torch.Generator().manual_seed(3)
    top = min(getattr(config, "max_2d_position_embeddings", 128), 128) - 1
    corner = torch.randint(0, top // 2, (*ids.shape, 2), generator=g)
    return {"bbox": torch.cat([corner, corner + top // 2], dim=-1)}


OVERRIDES: dict[str, dict[str, Any]] = {
    # hybrids: at least one attention layer next to the recurrent / SSM ones
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
              "expert_layer_offset": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # the shared transformer block is tied across hybrid layers: two of them; its input is the
    # hidden state concatenated with the embeddings (2 * hidden)
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1,
              "attention_hidden_size": 64, "attention_head_dim": 16, "mamba_dt_rank": 4},
    "zamba2": {"num_hidden_layers": 4, "hybrid_layer_ids": [1, 3],
               "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
               "attention_hidden_size": 64, "attention_head_dim": 16, "mamba_headdim": 8,
               "num_query_groups": 2, "n_mamba_heads": 8},
    # nGPT looped depth: 1 input layer, 1 recurrent layer run twice, 1 output layer
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_recurrent_layers": 1,
             "n_output_layers": 1, "n_recurrent_loops": 2,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    # defaults the models cannot build from
    "cohere_compass_text": {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}},
    "esm": {"pad_token_id": 0, "mask_token_id": 2},
    # the default blocks (4, 4, 4) of the released checkpoints: layers repeat their index
    # within a block, and the queries are pooled between blocks
    "funnel": {"architectures": ["FunnelModel"]},
    # sizes that must add up
    "bros": {"hidden_size": 64},  # box sinusoids of hidden / 4 / 8 dims, in pairs
    "dots3_note_text": {"num_key_value_heads": 4, "head_dim": 16},  # sliding: nope + rope
    "mistral4": {"head_dim": 16},  # latent attention: nope + rope dims
    "qwen4_exp_text": {"indexer_kv_heads": 1},
    "esmc": {"num_key_value_heads": 4},
    "layoutlmv3": {"coordinate_size": 4, "shape_size": 8},  # 4 * 4 + 2 * 8 = hidden
    "lilt": {"hidden_size": 48},  # six box embeddings of hidden / channel_shrink_ratio / 6
    "mamba2": {"num_heads": 8},  # num_heads * head_dim == expand * hidden_size
    "neomme": {"head_dim": 16},  # a quarter of the head rotated, in pairs of two axes
    "reformer": {"axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 16],
                 "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4},
    "zaya": {"num_experts_per_tok": 1},
    # attention far from uniform
    "clip_text_model": {"initializer_factor": 3.0},  # its init scales std by this factor
    "markuplm": {"max_depth": 4},  # XPath tables of 50 levels: most of the parameters
    # 4 latents (fewer than the tokens: the latent axis is kept whole, like pooled queries)
    "perceiver": {"num_latents": 4, "num_self_attends_per_block": 2,
                  "num_self_attention_heads": 4, "num_cross_attention_heads": 4},
}
def _no_cache(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """The model's cache cannot be built from its (tiny) config; the forward needs none."""
    return {"use_cache": False}


def _fsmt_masks(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """FSMT builds its decoder's padding and causal masks only without the cache; with it
    (its default) the decoder attends to every position, padding included."""
    return {"use_cache": False}


def _language(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    return {"lang_ids": torch.zeros(len(inputs["input_ids"]), dtype=torch.long)}


def _xpaths(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """Random XPath tag / subscript ids per token: with the default (all-padding) XPath every
    token gets the same large XPath embedding and attention is nearly uniform."""
    g = torch.Generator().manual_seed(5)
    shape = (*inputs["input_ids"].shape, config.max_depth)
    return {"xpath_tags_seq": torch.randint(0, config.max_xpath_tag_unit_embeddings - 1, shape,
                                            generator=g),
            "xpath_subs_seq": torch.randint(0, config.max_xpath_subs_unit_embeddings - 1, shape,
                                            generator=g)}


def _embedded(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """Perceiver's base model has no token embedding (its preprocessors do): it reads
    ``inputs`` ``[batch, seq, d_model]``; random vectors stand in for embedded tokens."""
    g = torch.Generator().manual_seed(6)
    ids = inputs["input_ids"]
    return {"input_ids": None, "inputs": torch.randn(*ids.shape, config.d_model, generator=g)}


def _visual(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """Three random visual features per example (LXMERT's object features and boxes)."""
    g = torch.Generator().manual_seed(4)
    batch = len(inputs["input_ids"])
    return {"visual_feats": torch.randn(batch, 3, config.visual_feat_dim, generator=g),
            "visual_pos": torch.rand(batch, 3, config.visual_pos_dim, generator=g)}


EXTRA_INPUTS: dict[str, InputsFn] = {
    "bros": _boxes, "layoutlm": _boxes, "layoutlmv3": _boxes, "lilt": _boxes,
    "blt": _no_cache, "xlstm": _no_cache, "fsmt": _fsmt_masks, "xmod": _language, "lxmert": _visual,
    "markuplm": _xpaths, "perceiver": _embedded,
}
