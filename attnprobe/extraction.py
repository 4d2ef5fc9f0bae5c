"""Text in, attention out: tokenise, run batches under :func:`capture`, return tidy results."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.errors import InputError
from attnprobe.heads.reducers import Reducer, Tally, default_reducers
from attnprobe.loading import load_model
from attnprobe.types import AttentionMap

__all__ = ["check_texts", "encode", "extract", "head_stats", "load_model", "max_length_of"]

_HUGE = 1_000_000  # tokenizers report "no limit" as a huge sentinel


def check_texts(texts: Sequence[str] | str) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise InputError("no text given")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"text {i} is {type(text).__name__}, not str")
        if not text.strip():
            raise InputError(f"text {i} is empty")
    return texts


def max_length_of(model: nn.Module, tokenizer: Any) -> int | None:
    """The most tokens the model accepts (tokenizer limit and position table), if known."""
    limits = [getattr(tokenizer, "model_max_length", None)]
    config = getattr(model, "config", None)
    limits.append(getattr(config, "max_position_embeddings", None))
    limits.append(getattr(config, "max_len", None))
    limits = [n for n in limits if isinstance(n, int) and 0 < n < _HUGE]
    return min(limits) if limits else None


def _is_hf_tokenizer(tokenizer: Any) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(tokenizer, transformers.PreTrainedTokenizerBase)


def encode(model: nn.Module, tokenizer: Any, texts: Sequence[str], *,
           max_length: int | None = None, truncation: bool = False,
           padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Tokenise a batch; too-long texts are an error unless ``truncation=True``, which cuts
    them the tokenizer's way (special tokens kept).

    Returns ``input_ids`` and ``attention_mask`` ``[batch, seq]`` (1 = real token).
    """
    if padding_side not in ("left", "right"):
        raise InputError(f"padding_side must be 'left' or 'right'; got {padding_side!r}")
    limit = max_length_of(model, tokenizer)
    if max_length is not None:
        if max_length < 1:
            raise InputError(f"max_length must be positive; got {max_length}")
        limit = min(limit, max_length) if limit else max_length
    cut = {"truncation": True, "max_length": limit} if truncation and limit else {}
    if _is_hf_tokenizer(tokenizer):
        old_side = tokenizer.padding_side
        tokenizer.padding_side = padding_side
        try:
            batch = tokenizer(list(texts), padding=True, return_tensors="pt",
                              **(cut or {"truncation": False}))
        finally:
            tokenizer.padding_side = old_side
        batch = {k: batch[k] for k in ("input_ids", "attention_mask")}
    else:
        # length limits are checked below, the same way for every tokenizer
        batch = dict(tokenizer(list(texts), padding_side=padding_side,
                               **(cut or {"max_length": _HUGE})))
    lengths = batch["attention_mask"].sum(-1)
    if limit is not None and int(lengths.max()) > limit:
        i = int(lengths.argmax())
        raise InputError(f"text {i} has {int(lengths[i])} tokens but the model takes at most "
                         f"{limit}; pass truncation=True (CLI: --truncate) to cut it")
    return batch


def _model_inputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in batch.items()}
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        # The text is fed to both sides, so decoder self- and cross-attention are captured too.
        inputs["decoder_input_ids"] = inputs["input_ids"]
        inputs["decoder_attention_mask"] = inputs["attention_mask"]
    return inputs


def _batches(n: int, size: int) -> list[slice]:
    if size < 1:
        raise InputError(f"batch_size must be positive; got {size}")
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def extract(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, *,
            layers: Sequence[int] | int | None = None, heads: Sequence[int] | int | None = None,
            batch_size: int = 16, max_length: int | None = None,
            truncation: bool = False) -> list[AttentionMap]:
    """Attention maps of each text, padding stripped.

    Batches are padded on the right, so every model numbers the real tokens from 0 and a
    text's maps do not depend on the other texts of its batch.

    Returns:
        ``list[AttentionMap]``: one per text (one per text and attention stack for
        encoder-decoder models), each ``[layer, head, query, key]``.

    Example:
        >>> model, tok = ap.load_model("minilm")
        >>> maps = ap.extract(model, tok, ["The cat sat on the mat."], layers=[0])
    """
    texts = check_texts(texts)
    maps: list[AttentionMap] = []
    for span in _batches(len(texts), batch_size):
        batch = encode(model, tokenizer, texts[span], max_length=max_length,
                       truncation=truncation)
        ids = [str(i) for i in range(span.start, span.stop)]
        with torch.no_grad(), capture(model, layers=layers, heads=heads, tokenizer=tokenizer,
                                      example_ids=ids) as cap:
            model(**_model_inputs(model, batch))
        maps.extend(cap.maps)
    return maps


def head_stats(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, *,
               layers: Sequence[int] | int | None = None,
               heads: Sequence[int] | int | None = None,
               reducers: Sequence[Reducer] | None = None, batch_size: int = 16,
               max_length: int | None = None, truncation: bool = False,
               query_block: int | None = None) -> Tally:
    """Streaming per-head statistics over a corpus; no attention map is kept.

    Returns a :class:`~attnprobe.heads.reducers.Tally` (``.summary()`` for one row per head,
    ``.to_frame()`` tidy); tallies of different corpora merge with ``+``.
    """
    texts = check_texts(texts)
    reducers = list(reducers) if reducers is not None else default_reducers()
    total = Tally()
    for span in _batches(len(texts), batch_size):
        batch = encode(model, tokenizer, texts[span], max_length=max_length,
                       truncation=truncation)
        with torch.no_grad(), capture(model, layers=layers, heads=heads, keep=False,
                                      reducers=reducers, query_block=query_block) as cap:
            model(**_model_inputs(model, batch))
        total = total + cap.tally
    return total
