"""Tiny transformers models whose attention modules compute their weights themselves, and
models whose attention modules run in unusual ways (nothing is downloaded).

Sizes follow ``hf_models``: hidden 32, 2 layers, 4 heads, vocab 100; real tokens are drawn
from ``FIRST_REAL_ID..VOCAB-1``. :func:`build_pair` returns the model as transformers builds it
(SDPA where the family has an SDPA path) and an eager twin with the same weights, whose
``output_attentions=True`` is the reference.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers

from tests.conftest import track
from tests.integration.hf_models import FIRST_REAL_ID, VOCAB

HIDDEN, N_LAYERS, N_HEADS = 32, 2, 4


@dataclass(frozen=True)
class Legacy:
    """A family, how to build its config, its padding id, whether it is causal, and the
    output projection after layer 0's attention (``None``: the family has no module there)."""

    name: str
    config: Callable[[], transformers.PretrainedConfig]
    pad_id: int
    causal: bool
    out_proj: str | None


def _common(**extra: object) -> dict:
    return dict(vocab_size=VOCAB, initializer_range=0.3, **extra)


LEGACY: dict[str, Legacy] = {f.name: f for f in (
    Legacy("gpt_neo", lambda: transformers.GPTNeoConfig(
        **_common(hidden_size=HIDDEN, num_layers=N_LAYERS, num_heads=N_HEADS,
                  attention_types=[[["global", "local"], 1]], window_size=4,
                  max_position_embeddings=64, intermediate_size=64, bos_token_id=1,
                  eos_token_id=2)),
        pad_id=0, causal=True, out_proj="h.0.attn.attention.out_proj"),
    Legacy("bloom", lambda: transformers.BloomConfig(
        **_common(hidden_size=HIDDEN, n_layer=N_LAYERS, n_head=N_HEADS, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)),
        pad_id=0, causal=True, out_proj="h.0.self_attention.dense"),
    Legacy("falcon", lambda: transformers.FalconConfig(  # its SDPA path calls torch's SDPA
        **_common(hidden_size=HIDDEN, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                  num_kv_heads=N_HEADS, new_decoder_architecture=False, multi_query=False,
                  alibi=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        pad_id=0, causal=True, out_proj="h.0.self_attention.dense"),
    Legacy("deberta-v2", lambda: transformers.DebertaV2Config(
        **_common(hidden_size=HIDDEN, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                  intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                  pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16,
                  pad_token_id=0)),
        pad_id=0, causal=False, out_proj="encoder.layer.0.attention.output.dense"),
    Legacy("mpnet", lambda: transformers.MPNetConfig(
        **_common(hidden_size=HIDDEN, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                  intermediate_size=64, max_position_embeddings=64, pad_token_id=1)),
        pad_id=1, causal=False, out_proj="encoder.layer.0.attention.attn.o"),
    Legacy("longformer", lambda: transformers.LongformerConfig(  # a window of 4: banded
        **_common(hidden_size=HIDDEN, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                  intermediate_size=64, max_position_embeddings=80, attention_window=4,
                  pad_token_id=1)),
        pad_id=1, causal=False, out_proj="encoder.layer.0.attention.output.dense"),
    Legacy("xlnet", lambda: transformers.XLNetConfig(  # time-first tensors, einsum heads
        **_common(d_model=HIDDEN, n_layer=N_LAYERS, n_head=N_HEADS, d_inner=64,
                  pad_token_id=0)),
        pad_id=0, causal=False, out_proj=None),
)}


def build_pair(name: str, seed: int = 0) -> tuple[transformers.PreTrainedModel,
                                                  transformers.PreTrainedModel]:
    """``(model, eager_twin)`` of family ``name``: equal weights, separate configs; only the
    model attnprobe captures is tracked for left-over hooks."""
    torch.manual_seed(seed)
    config = LEGACY[name].config()
    model = transformers.AutoModel.from_config(copy.deepcopy(config)).eval()
    twin = transformers.AutoModel.from_config(copy.deepcopy(config),
                                              attn_implementation="eager").eval()
    twin.load_state_dict(model.state_dict())
    return track(model), twin


def padded(name: str, lengths: tuple[int, ...] = (7, 4), seed: int = 1) -> dict[str, torch.Tensor]:
    """A padded batch for family ``name``: on the left for causal families, else the right."""
    family = LEGACY[name]
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), family.pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        span = slice(width - n, width) if family.causal else slice(0, n)
        ids[i, span] = torch.randint(FIRST_REAL_ID, VOCAB, (n,), generator=g)
        mask[i, span] = 1
    return {"input_ids": ids, "attention_mask": mask}
