"""Shared pieces of the attention views: the query spec, layer look-up, text and map checks
and the residual-augmented, head-reduced weights that rollout and flow multiply through.

Which query row is read (``query``) is described in :mod:`attnprobe.attribution.views`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation, check_texts, encode, model_inputs
from attnprobe.types import AttentionMap

Query = Literal["auto", "cls", "first", "last", "mean", "max"] | int
HeadReduce = Literal["mean", "max", "min"]

QUERIES = ("auto", "cls", "first", "last", "mean", "max")
HEAD_REDUCES = ("mean", "max", "min")


# ----------------------------------------------------------------------------- helpers
def one_text(text: str) -> list[str]:
    """``[text]`` after the checks every text gets (a view explains one text at a time)."""
    if not isinstance(text, str):
        raise InputError(f"text must be one string; got {type(text).__name__}")
    return check_texts([text])


def one_unpadded_input(model: nn.Module, tokenizer: Any, text: str,
                       inputs: Mapping[str, torch.Tensor] | None, *, truncation: Truncation,
                       max_length: int | None, what: str) -> dict[str, torch.Tensor]:
    """The model's inputs ``[1, seq]`` for one text (encoded here) or for ``inputs`` given
    encoded, refused when batched or padded (a padded position would be scored as a token of
    the text) — for the views that run the model on one text (``what`` names the view)."""
    if inputs is None:
        inputs = encode(model, tokenizer, one_text(text), truncation=truncation,
                        max_length=max_length)
    found = model_inputs(model, dict(inputs))
    mask = found.get("attention_mask")
    if found["input_ids"].shape[0] != 1 or (mask is not None and not bool(mask.all())):
        raise InputError(f"{what} explains one unpadded text at a time ([1, seq] inputs, "
                         "attention mask all ones)")
    return found


def check_query(query: Query) -> None:
    """Refuse a query spec that no matrix could read, before any forward."""
    if isinstance(query, str) and query in QUERIES:
        return
    if isinstance(query, (int, np.integer)) and not isinstance(query, bool):
        return
    raise InputError(f"query must be one of {list(QUERIES)} or an int row; got {query!r}")


def resolve_query(query: Query, causal: bool | None) -> Query:
    """``"auto"`` as the row a model of this kind is read at: ``"last"`` (the last real
    token, which sees the whole text) for causal models, ``"cls"`` (the first token) for
    bidirectional or unknown ones; any other spec as it is."""
    check_query(query)
    if isinstance(query, str) and query == "auto":
        return "last" if causal else "cls"
    return query


def map_causal(amap: AttentionMap) -> bool | None:
    """Whether ``amap`` comes from causal attention: its model's flag, else whether no row of
    a square self-attention map puts weight on a later key."""
    if amap.info.causal is not None:
        return amap.info.causal
    if amap.kind != "self" or amap.shape[2] != amap.shape[3]:
        return None
    later = torch.ones(amap.shape[2], amap.shape[3], dtype=torch.bool).triu(1)
    return not bool(amap.pattern[..., later].any())


def read_query(matrix: torch.Tensor, query: Query) -> torch.Tensor:
    """One ``[key]`` vector from a ``[query, key]`` matrix (see the views module
    docstring); ``"auto"`` must have been resolved (:func:`resolve_query`)."""
    n = matrix.shape[0]
    if isinstance(query, str) and query == "auto":
        raise InputError("query 'auto' depends on the model: resolve it first "
                         "(resolve_query(query, causal))")
    if isinstance(query, str):
        if query in ("cls", "first"):
            return matrix[0]
        if query == "last":
            return matrix[-1]
        if query == "mean":
            return matrix.mean(0)
        if query == "max":
            return matrix.amax(0)
    elif isinstance(query, (int, np.integer)) and not isinstance(query, bool):
        if not -n <= int(query) < n:
            raise InputError(f"query row {query} out of range for {n} query tokens")
        return matrix[int(query)]
    raise InputError(f"query must be one of {list(QUERIES)} or an int row; got {query!r}")


def query_rows(query: Query, n: int) -> list[int]:
    """The rows a query spec reads (all rows for ``mean`` / ``max``)."""
    if query in ("mean", "max"):
        return list(range(n))
    probe = torch.arange(n, dtype=torch.float64)[:, None]
    return [int(read_query(probe, query)[0])]


def prefix_map(amap: AttentionMap, n: int) -> AttentionMap:
    """The first ``n`` tokens of a causal self-attention map (rows and keys ``[:n]``): for
    causal attention exactly the map of a forward over those tokens alone, e.g. the context
    from which the token at position ``n`` was generated. Refused (rows no longer summing to
    1) for a map whose first rows attend to later keys."""
    check_self(amap, "prefix_map")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= amap.shape[2]:
        raise InputError(f"prefix length must be an int in 1..{amap.shape[2]}; got {n!r}")
    prompt = amap.prompt_length
    return replace(amap, pattern=amap.pattern[:, :, :n, :n],
                   scores=None if amap.scores is None else amap.scores[:, :, :n, :n],
                   query_tokens=amap.query_tokens[:n], key_tokens=amap.key_tokens[:n],
                   query_ids=None if amap.query_ids is None else amap.query_ids[:n],
                   key_ids=None if amap.key_ids is None else amap.key_ids[:n],
                   prompt_length=None if prompt is None else min(prompt, n))


def layer_position(amap: AttentionMap, layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
            or int(layer) not in amap.layers:
        raise InputError(f"layer {layer!r} not in this map; it has layers {list(amap.layers)}")
    return amap.layers.index(int(layer))


def check_self(amap: AttentionMap, what: str) -> None:
    if not isinstance(amap, AttentionMap):
        raise InputError(f"{what} takes an AttentionMap; got {type(amap).__name__}")
    if amap.kind != "self" or amap.shape[2] != amap.shape[3]:
        raise InputError(f"{what} needs a self-attention map (square [query, key]); got "
                         f"kind {amap.kind!r}, shape {amap.shape}")


def check_stack(amap: AttentionMap, what: str) -> None:
    """Rollout and flow multiply through every layer from the first one."""
    check_self(amap, what)
    if amap.layers != tuple(range(len(amap.layers))):
        raise InputError(f"{what} needs every layer from 0 in order; this map has layers "
                         f"{list(amap.layers)} (extract with layers=None)")


def augmented(amap: AttentionMap, *, residual: bool, head_reduce: HeadReduce) -> torch.Tensor:
    """``[layer, query, key]`` float64: heads reduced, rows renormalised, residual added."""
    if head_reduce not in HEAD_REDUCES:
        raise InputError(f"head_reduce must be one of {list(HEAD_REDUCES)}; got {head_reduce!r}")
    p = amap.pattern.to(torch.float64)
    w = {"mean": lambda: p.mean(1), "max": lambda: p.amax(1), "min": lambda: p.amin(1)}[
        head_reduce]()
    sums = w.sum(-1, keepdim=True)
    if (sums <= 0).any():
        layer, row = (sums[..., 0] <= 0).nonzero()[0].tolist()
        raise InputError(f"head_reduce={head_reduce!r} leaves query row {row} of layer "
                         f"{amap.layers[layer]} with no weight; use head_reduce='mean'")
    w = w / sums
    if residual:
        w = 0.5 * w + 0.5 * torch.eye(w.shape[-1], dtype=w.dtype)
    return w
