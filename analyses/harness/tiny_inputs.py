"""Padded batches for the tiny models of :mod:`harness.tiny_models`.

:func:`make_inputs` gives 3 sequences of 7, 4 and 6 real tokens (right padding for encoders,
left for decoder-only models), their attention mask, and for encoder-decoder models decoder
inputs of 5, 6 and 3 tokens (right padding). Ids are drawn from ``FIRST_REAL_ID`` up to the
tiny vocabulary, never a special id; a family that needs more (boxes, XPaths, a language id)
gets it from :data:`harness.tiny_tables.EXTRA_INPUTS`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from harness.tiny_models import FIRST_REAL_ID, special_ids, vocab_size
from harness.tiny_tables import EXTRA_INPUTS

LENGTHS = (7, 4, 6)      # real tokens of the main (encoder / only) side
DEC_LENGTHS = (5, 6, 3)  # real tokens of the decoder side of encoder-decoder models


@dataclass
class Batch:
    """Model keyword arguments and the real-token masks ``[batch, seq]`` of each side."""

    inputs: dict[str, Any]
    masks: dict[str, torch.Tensor]  # "main" (encoder / only side), "decoder"
    padding: str  # "left" | "right"


def is_causal_lm(model_type: str, config: Any) -> bool:
    """Decoder-only: a causal LM head, no masked LM head, not encoder-decoder."""
    from transformers.models.auto import modeling_auto as ma

    return (model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and model_type not in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and not getattr(config, "is_encoder_decoder", False))


def padded(lengths: tuple[int, ...], vocab: int, avoid: set[int], pad_id: int, side: str,
           seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, max(lengths)]`` ids drawn from ``FIRST_REAL_ID..vocab-1`` minus ``avoid``,
    padded on ``side`` with ``pad_id``; and the 0/1 attention mask."""
    allowed = torch.tensor([i for i in range(FIRST_REAL_ID, vocab) if i not in avoid])
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        span = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, span] = allowed[torch.randint(len(allowed), (n,), generator=g)]
        mask[row, span] = 1
    return ids, mask


def make_inputs(model_type: str, model: torch.nn.Module, config: Any,
                lengths: tuple[int, ...] = LENGTHS, dec_lengths: tuple[int, ...] = DEC_LENGTHS,
                side: str | None = None) -> Batch:
    """The padded batch for ``model`` (see module docstring); :data:`EXTRA_INPUTS` adds what
    a family needs beyond ids and masks. ``lengths`` / ``dec_lengths`` / ``side`` (the
    padding side of the main input; default by the model kind) give another shape."""
    vocab, avoid = vocab_size(config), special_ids(config)
    pad = getattr(config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) else 0
    pad = pad if 0 <= pad < vocab else 0
    side = side or ("left" if is_causal_lm(model_type, config) else "right")
    ids, mask = padded(lengths, vocab, avoid, pad, side, seed=1)
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    masks = {"main": mask.bool()}
    params = inspect.signature(model.forward).parameters
    if getattr(config, "is_encoder_decoder", False) or "decoder_input_ids" in params:
        dec, dec_mask = padded(dec_lengths, vocab, avoid, pad, "right", seed=2)
        inputs.update(decoder_input_ids=dec, decoder_attention_mask=dec_mask)
        masks["decoder"] = dec_mask.bool()
    extra = EXTRA_INPUTS.get(model_type)
    for key, value in (extra(inputs, config) if extra is not None else {}).items():
        if value is None:
            inputs.pop(key, None)
        else:
            inputs[key] = value
    return Batch(inputs=inputs, masks=masks, padding=side)
