"""Texts as the caller gives them: strings, or token ids used as given.

Every corpus analysis takes, besides strings (:func:`check_inputs`):

- a list of token-id sequences, ``[[2, 14, 15], [7, 8]]`` (ints, or 1-D integer tensors /
  arrays), possibly mixed with strings;
- a 2-D integer tensor ``[text, token]``: every position is a real token;
- a tokenizer's output (any mapping with ``input_ids``, and ``attention_mask`` when it is
  padded): each row's padding, on either side, is stripped by the mask.

Ids become :class:`TokenIds`, which the model is given exactly (no special token is added);
their range is checked against the model's input embedding (:func:`input_vocab_size`) where
the batch is built. A text's index in the caller's list (the row, for a tensor) stays its
``example_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from attnprobe.errors import InputError

__all__ = ["Text", "TokenIds", "as_token_ids", "check_inputs", "input_embeddings",
           "input_vocab_size"]

_FORMS = ("a string, a list of strings or token-id sequences ([[2, 14, 15], ...]), a 2-D "
          "id tensor, or a tokenizer output with input_ids")


@dataclass(frozen=True)
class TokenIds:
    """One text given as token ids ``[token]``; the model gets exactly these."""

    ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        shown = " ".join(map(str, self.ids[:8])) + (" …" if len(self.ids) > 8 else "")
        return f"TokenIds({len(self.ids)}: {shown})"


Text = str | TokenIds
"""One text of a corpus: a string (tokenised the tokenizer's way) or :class:`TokenIds`."""


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_token_ids(value: Any, where: str) -> TokenIds:
    """``value`` (a sequence of ints, or a 1-D integer tensor / array) as :class:`TokenIds`;
    a one-line error naming ``where`` otherwise."""
    if isinstance(value, TokenIds):
        found = list(value.ids)
    elif isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 1:
            raise InputError(f"{where} is a {value.ndim}-D array of ids; give one 1-D "
                             "sequence per text")
        integer = (not value.is_floating_point() and not value.is_complex()
                   and value.dtype != torch.bool) if isinstance(value, torch.Tensor) \
            else value.dtype.kind in "iu"
        if not integer:
            raise InputError(f"{where} holds {value.dtype} values; token ids are integers")
        found = [int(i) for i in value.tolist()]
    else:
        found = list(value)
        bad = next((v for v in found if not _is_int(v)), None)
        if bad is not None:
            raise InputError(f"{where} holds {bad!r} ({type(bad).__name__}); token ids are "
                             "integers")
        found = [int(i) for i in found]
    if not found:
        raise InputError(f"{where} has no token ids")
    negative = next((i for i in found if i < 0), None)
    if negative is not None:
        raise InputError(f"{where} holds token id {negative}; ids are >= 0")
    return TokenIds(tuple(found))


def _check_string(text: str, i: int) -> str:
    if not text.strip():
        raise InputError(f"text {i} is empty")
    first, tab, second = text.partition("\t")
    if tab and (not first.strip() or not second.strip()):
        raise InputError(f"text {i} is a sentence pair (it has a tab) with an empty half")
    return text


def _mask_rows(mask: Any) -> list[list[int]]:
    if isinstance(mask, (torch.Tensor, np.ndarray)):
        rows = mask.tolist()
        return [rows] if mask.ndim == 1 else rows
    rows = list(mask)
    if rows and all(_is_int(v) for v in rows):  # one text's mask
        return [[int(v) for v in rows]]
    return [[int(v) for v in (row.tolist() if hasattr(row, "tolist") else row)] for row in rows]


def _rows_of_mapping(batch: Mapping[str, Any]) -> list[TokenIds]:
    """Rows of a tokenizer output, each stripped of its padding by ``attention_mask``."""
    ids = batch.get("input_ids")
    if ids is None:
        raise InputError(f"a mapping of texts needs input_ids; got keys {sorted(map(str, batch))}")
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        rows = _rows_of_tensor(ids, "input_ids")
    elif ids and all(_is_int(v) for v in ids):  # one text's output, tokenizer("...")
        rows = [as_token_ids(ids, "input_ids")]
    else:
        rows = [as_token_ids(row, f"text {i}") for i, row in enumerate(ids)]
    mask = batch.get("attention_mask")
    if mask is None:
        return rows
    masks = _mask_rows(mask)
    if len(masks) != len(rows) or any(len(m) != len(r) for m, r in zip(masks, rows,
                                                                       strict=True)):
        raise InputError("attention_mask does not match input_ids in shape")
    out = []
    for i, (row, real) in enumerate(zip(rows, masks, strict=True)):
        kept = tuple(t for t, keep in zip(row.ids, real, strict=True) if keep)
        if not kept:
            raise InputError(f"text {i} has no real token (its attention_mask is all 0)")
        out.append(TokenIds(kept))
    return out


def _rows_of_tensor(ids: torch.Tensor | np.ndarray, where: str) -> list[TokenIds]:
    if ids.ndim == 1:
        return [as_token_ids(ids, where)]
    if ids.ndim != 2:
        raise InputError(f"{where} must be [text, token] (2-D); got shape {tuple(ids.shape)}")
    if ids.shape[0] == 0:
        raise InputError("no text given")
    return [as_token_ids(row, f"text {i}") for i, row in enumerate(ids)]


def check_inputs(texts: Any) -> list[Text]:
    """The caller's texts as a non-empty list of strings and :class:`TokenIds` (module
    docstring); a one-line :class:`~attnprobe.errors.InputError` for anything else (``None``,
    a number, an empty text, a float tensor ...)."""
    if isinstance(texts, str):
        return [_check_string(texts, 0)]
    if isinstance(texts, TokenIds):
        return [texts]
    if isinstance(texts, np.ndarray) and texts.dtype.kind in "UO":  # an array of strings
        texts = texts.tolist()
    if isinstance(texts, (torch.Tensor, np.ndarray)):
        return list(_rows_of_tensor(texts, "the id tensor"))
    if isinstance(texts, Mapping):
        return list(_rows_of_mapping(texts))
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Iterable):
        raise InputError(f"texts must be {_FORMS}; got {type(texts).__name__}")
    items = list(texts)
    if not items:
        raise InputError("no text given")
    out: list[Text] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append(_check_string(item, i))
        elif isinstance(item, (TokenIds, torch.Tensor, np.ndarray, Sequence)) \
                and not isinstance(item, (bytes, bytearray)):
            out.append(as_token_ids(item, f"text {i}"))
        elif _is_int(item):
            raise InputError(f"text {i} is a single int; give token ids as one sequence per "
                             "text, e.g. [[2, 14, 15]]")
        else:
            raise InputError(f"text {i} is {type(item).__name__}; texts must be {_FORMS}")
    return out


def input_embeddings(model: nn.Module) -> nn.Module | None:
    """``model.get_input_embeddings()`` (transformers models), or None where it has none."""
    get = getattr(model, "get_input_embeddings", None)
    if not callable(get):
        return None
    try:
        layer = get()
    except (NotImplementedError, AttributeError):
        return None
    return layer if isinstance(layer, nn.Module) else None


def input_vocab_size(model: nn.Module) -> int | None:
    """Rows of the model's input embedding (token ids must lie below), if known."""
    layer = input_embeddings(model)
    if isinstance(layer, nn.Embedding):
        return int(layer.num_embeddings)
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
