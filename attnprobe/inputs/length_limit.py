"""The most tokens a model accepts per text: the tokenizer's ``model_max_length`` and the
model's position table, read by the model's own rule.

Most position tables hold one row per position, so ``max_position_embeddings`` tokens fit.
RoBERTa's family (XLM-R, CamemBERT, Longformer, Data2VecText, ...) and MPNet number the
positions from ``padding_idx + 1`` (the rows up to ``padding_idx`` belong to padding), so
their embedding module — the one that defines ``create_position_ids_from_inputs_embeds`` and
holds ``padding_idx`` and a ``position_embeddings`` table — takes
``rows - padding_idx - 1`` tokens (:func:`position_limit`): 512 for RoBERTa's 514 rows. Taking
the table's size there would let one or two tokens too many through to an ``IndexError`` in the
forward (and size the repeated-token probe past the table).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from attnprobe.errors import InputError

__all__ = ["NO_LIMIT", "max_length_of", "position_limit", "token_limit"]

NO_LIMIT = 1_000_000  # tokenizers report "no limit" as a huge sentinel; at or above it: none
_OFFSET_RULE = "create_position_ids_from_inputs_embeds"  # positions start after padding_idx


def _rows(table: Any) -> int | None:
    weight = getattr(table, "weight", None)
    shape = getattr(weight, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 2 else None


def position_limit(model: nn.Module) -> int | None:
    """Tokens the position table of an offset-numbering model (module docstring) holds:
    ``rows - padding_idx - 1``; None for any other model."""
    for module in model.modules():
        padding = getattr(module, "padding_idx", None)
        if not callable(getattr(module, _OFFSET_RULE, None)) or isinstance(padding, bool) \
                or not isinstance(padding, int) or padding < 0:
            continue
        rows = _rows(getattr(module, "position_embeddings", None))
        if rows is not None:
            return rows - padding - 1
    return None


def max_length_of(model: nn.Module, tokenizer: Any) -> int | None:
    """The most tokens the model accepts (tokenizer limit and position table), if known."""
    limits = [getattr(tokenizer, "model_max_length", None)]
    offset = position_limit(model) if isinstance(model, nn.Module) else None
    config = getattr(model, "config", None)
    limits.append(offset if offset is not None else
                  getattr(config, "max_position_embeddings", None))
    limits.append(getattr(config, "max_len", None))
    limits = [n for n in limits if isinstance(n, int) and 0 < n < NO_LIMIT]
    return min(limits) if limits else None


def token_limit(model: nn.Module, tokenizer: Any, max_length: int | None) -> int | None:
    """The most tokens per text: the model's own limit (:func:`max_length_of`), lowered to
    ``max_length`` when given (checked: a positive int); ``None`` when unknown."""
    limit = max_length_of(model, tokenizer)
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise InputError(f"max_length must be a positive integer; got {max_length!r}")
        limit = min(limit, max_length) if limit else max_length
    return limit
