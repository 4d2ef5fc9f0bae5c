"""Tiny random HuggingFace models built from configs (nothing is downloaded).

Every builder returns a fresh model in eval mode set to SDPA; :func:`build_pair` also returns
an "eager" twin with identical weights (built from a deep copy of the config, because models
built from one config object share it). Sizes: hidden 32, 2 layers, 4 heads (head dim 8),
vocab 100. Ids 0, 1 and 2 are special (pad / bos / eos) in every family; real tokens of the
test batches are drawn from ``FIRST_REAL_ID..VOCAB-1`` so they never collide with them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from torch import nn

from tests.conftest import track

VOCAB = 100
HIDDEN = 32
N_LAYERS = 2
N_HEADS = 4
HEAD_DIM = HIDDEN // N_HEADS
FIRST_REAL_ID = 3
SLIDING_WINDOW = 4  # Mistral: smaller than the longest test sequence (9), so it matters
INIT = 0.3  # larger than the default 0.02 so attention is far from uniform (tests are sensitive)


@dataclass(frozen=True)
class Family:
    """One HF model family and what the tests need to know about it.

    Attributes:
        name: family label (``attnprobe.loading.TESTED_FAMILIES``).
        config: builds a fresh config.
        model: builds a model (random weights, default attention) from a config.
        pad_id: padding token id.
        causal: self-attention (of the main / decoder stack) is causal.
        encdec: encoder-decoder model (takes ``decoder_input_ids``).
        position_ids: ``forward`` takes ``position_ids`` (used to make left and right
            padding equivalent for absolute-position models).
        out_proj: module paths of the output projections that follow layer 0's attention,
            one per attention stack (used to ablate head 0 of layer 0 on the eager twin).
    """

    name: str
    config: Callable[[], transformers.PretrainedConfig]
    model: Callable[[transformers.PretrainedConfig], transformers.PreTrainedModel]
    pad_id: int
    causal: bool
    encdec: bool
    position_ids: bool
    out_proj: tuple[str, ...]


def _bert() -> transformers.PretrainedConfig:
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, intermediate_size=2 * HIDDEN, max_position_embeddings=64,
        pad_token_id=0, initializer_range=INIT)


def _roberta() -> transformers.PretrainedConfig:
    # Position ids are derived from the padding (padding_idx = pad id 1), so they start after
    # the padding; max_position_embeddings leaves room for padding_idx + 1 + 9.
    return transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, intermediate_size=2 * HIDDEN, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, initializer_range=INIT)


def _gpt2() -> transformers.PretrainedConfig:
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=N_LAYERS, n_head=N_HEADS, n_positions=64,
        n_inner=2 * HIDDEN, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=INIT)


def _decoder_kwargs() -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=2,
                max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                initializer_range=INIT)


def _llama() -> transformers.PretrainedConfig:
    # num_key_value_heads (2) < num_attention_heads (4): grouped-query attention; RoPE.
    return transformers.LlamaConfig(**_decoder_kwargs())


def _mistral() -> transformers.PretrainedConfig:
    return transformers.MistralConfig(**_decoder_kwargs(), sliding_window=SLIDING_WINDOW)


def _qwen2() -> transformers.PretrainedConfig:
    return transformers.Qwen2Config(**_decoder_kwargs())


def _bart() -> transformers.PretrainedConfig:
    return transformers.BartConfig(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=N_LAYERS, decoder_layers=N_LAYERS,
        encoder_attention_heads=N_HEADS, decoder_attention_heads=N_HEADS,
        encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=None, init_std=INIT)


def _t5() -> transformers.PretrainedConfig:
    return transformers.T5Config(
        vocab_size=VOCAB, d_model=HIDDEN, d_kv=HEAD_DIM, d_ff=2 * HIDDEN, num_layers=N_LAYERS,
        num_decoder_layers=N_LAYERS, num_heads=N_HEADS, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, initializer_factor=1.0)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", _bert, lambda c: transformers.BertModel(c, add_pooling_layer=False),
           pad_id=0, causal=False, encdec=False, position_ids=True,
           out_proj=("encoder.layer.0.attention.output.dense",)),
    Family("roberta", _roberta, lambda c: transformers.RobertaModel(c, add_pooling_layer=False),
           pad_id=1, causal=False, encdec=False, position_ids=False,
           out_proj=("encoder.layer.0.attention.output.dense",)),
    Family("gpt2", _gpt2, transformers.GPT2Model,
           pad_id=0, causal=True, encdec=False, position_ids=True,
           out_proj=("h.0.attn.c_proj",)),
    Family("llama", _llama, transformers.LlamaModel,
           pad_id=0, causal=True, encdec=False, position_ids=True,
           out_proj=("layers.0.self_attn.o_proj",)),
    Family("mistral", _mistral, transformers.MistralModel,
           pad_id=0, causal=True, encdec=False, position_ids=True,
           out_proj=("layers.0.self_attn.o_proj",)),
    Family("qwen2", _qwen2, transformers.Qwen2Model,
           pad_id=0, causal=True, encdec=False, position_ids=True,
           out_proj=("layers.0.self_attn.o_proj",)),
    Family("bart", _bart, transformers.BartModel,
           pad_id=1, causal=False, encdec=True, position_ids=False,
           out_proj=("encoder.layers.0.self_attn.out_proj", "decoder.layers.0.self_attn.out_proj",
                     "decoder.layers.0.encoder_attn.out_proj")),
    Family("t5", _t5, transformers.T5Model,
           pad_id=0, causal=False, encdec=True, position_ids=False,
           out_proj=("encoder.block.0.layer.0.SelfAttention.o",
                     "decoder.block.0.layer.0.SelfAttention.o",
                     "decoder.block.0.layer.1.EncDecAttention.o")),
)}


def _all_configs(model: nn.Module) -> list:
    found = {}
    for sub in model.modules():
        config = getattr(sub, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found[id(config)] = config
    return list(found.values())


def implementations(model: nn.Module) -> set[str]:
    """The attention implementation of every config object reachable from ``model``."""
    return {config._attn_implementation for config in _all_configs(model)}


def _set(model: transformers.PreTrainedModel, implementation: str) -> None:
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    assert implementations(model) == {implementation}, implementations(model)


def build(name: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A fresh tiny ``name`` model in eval mode set to SDPA, tracked for leftover hooks."""
    torch.manual_seed(seed)
    family = FAMILIES[name]
    model = family.model(family.config()).eval()
    _set(model, "sdpa")
    return track(model)


def build_pair(name: str, seed: int = 0) -> tuple[transformers.PreTrainedModel,
                                                  transformers.PreTrainedModel]:
    """``(sdpa_model, eager_twin)``: identical weights, separate (deep-copied) configs.

    Only the SDPA model (the one attnprobe captures) is tracked for leftover hooks: since
    transformers 5, the first ``output_attentions=True`` call installs transformers' own
    permanent output-capturing forward hooks (``install_output_capuring_hook``) on the eager
    twin's layers, which the no-hooks guard would report as leaks whenever a test fails
    while the twin is still alive. attnprobe never touches the twin.
    """
    model = build(name, seed)
    twin = FAMILIES[name].model(copy.deepcopy(model.config)).eval()
    twin.load_state_dict(model.state_dict())
    assert twin.config is not model.config
    _set(twin, "eager")
    assert model.config._attn_implementation == "sdpa"  # the twin did not switch the original
    return model, twin
