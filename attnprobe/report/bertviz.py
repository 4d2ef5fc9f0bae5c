"""Export attention maps in BertViz's format, so existing BertViz notebooks keep working.

BertViz (``bertviz.head_view`` / ``bertviz.model_view``, see ``bertviz/head_view.py`` and
``bertviz/model_view.py`` in jessevig/bertviz) takes ``attention``: one tensor per layer of
shape ``[batch=1, heads, seq, seq]`` (what HuggingFace returns with
``output_attentions=True``), and ``tokens``: a list of strings. Its page then receives
``{"all": {"attn": [layer][head][query][key], "left_text": tokens, "right_text": tokens}}``
(``attn`` is ``bertviz.util.format_attention(attention).tolist()``: the batch axis squeezed,
layers stacked). Left text labels query rows, right text labels key columns.

BertViz numbers layers and heads by position, from 0. :func:`to_bertviz` therefore refuses a
map that holds a subset of layers or heads that does not start at 0 and run contiguously
(labels would be wrong) unless ``renumber=True``. :func:`save_bertviz` records each map's
model ``layers`` and ``heads`` next to its BertViz data, so no labelling is lost there.

Needs only torch; BertViz itself is never imported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnprobe.core.files import atomic_write
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap

__all__ = ["bertviz_json", "save_bertviz", "to_bertviz"]


def _check_numbering(amap: AttentionMap) -> None:
    for name, values in (("layers", amap.layers), ("heads", amap.heads)):
        if tuple(values) != tuple(range(len(values))):
            raise InputError(
                f"BertViz numbers {name} from 0, but map {amap.example_id!r} holds model "
                f"{name} {list(values)}; they would show as {list(range(len(values)))}. "
                "Extract all of them (or a prefix), or pass renumber=True to accept that")


def to_bertviz(amap: AttentionMap, *,
               renumber: bool = False) -> tuple[tuple[torch.Tensor, ...], list[str]]:
    """``(attention, tokens)`` to pass to ``bertviz.head_view`` / ``bertviz.model_view``.

    ``attention`` holds one ``[1, heads, n, n]`` float tensor per layer of the map, in its
    layer order; ``tokens`` is the map's token list. Self-attention maps only: BertViz
    shows one token list on both sides (for cross-attention use :func:`bertviz_json`).

    Raises:
        InputError: a cross-attention map, or (unless ``renumber``) layers/heads that
            BertViz would label wrongly.

    Example:
        >>> attention, tokens = to_bertviz(amap)        # for bertviz.head_view(...)
        >>> len(attention), attention[0].shape          # one [1, heads, n, n] per layer
        (6, torch.Size([1, 12, 9, 9]))
        >>> tokens[:3]
        ['[CLS]', 'the', 'cat']
        >>> to_bertviz(amap.select(layers=[2, 3]))      # BertViz would call them 0 and 1
        Traceback (most recent call last):
        attnprobe.errors.InputError: BertViz numbers layers from 0, but map '0' holds ...
    """
    if amap.kind != "self" or amap.query_tokens != amap.key_tokens:
        raise InputError(
            f"map {amap.example_id!r} is {amap.kind}-attention with different query and key "
            "tokens; bertviz.head_view/model_view show one token list on both sides. "
            "Use bertviz_json (left_text = query, right_text = key) instead")
    if not renumber:
        _check_numbering(amap)
    attention = tuple(amap.pattern[i].unsqueeze(0).clone() for i in range(len(amap.layers)))
    return attention, list(amap.query_tokens)


def bertviz_json(amap: AttentionMap) -> dict[str, Any]:
    """The attention data BertViz's page consumes, built as ``head_view`` builds it.

    ``{"all": {"attn": [layer][head][query][key], "left_text": query tokens,
    "right_text": key tokens}}``. Layers and heads are by position (see module notes);
    :func:`save_bertviz` stores the model indices beside it. Tokens are not prettified.

    Example:
        >>> data = bertviz_json(amap)["all"]
        >>> attn = torch.tensor(data["attn"])           # [layer, head, query, key]
        >>> torch.equal(attn, amap.pattern), data["left_text"] == list(amap.query_tokens)
        (True, True)
    """
    return {
        "all": {
            "attn": amap.pattern.tolist(),
            "left_text": list(amap.query_tokens),
            "right_text": list(amap.key_tokens),
        }
    }


def save_bertviz(maps: Sequence[AttentionMap], path: str | Path) -> Path:
    """Write a JSON list with one entry per map, atomically (a killed run leaves the old file
    or none, never a truncated one); returns the path.

    Each entry: ``example_id``, ``kind``, ``stack``, ``layers`` and ``heads`` (model indices
    of BertViz's positions 0, 1, ...), and ``attention`` (:func:`bertviz_json`).

    Raises:
        InputError: no maps.
        OutputError: ``path`` is a directory or cannot be written.

    Example:
        >>> save_bertviz(maps, "bertviz.json")
        PosixPath('bertviz.json')
        >>> entries = json.loads(Path("bertviz.json").read_text())
        >>> [(e["example_id"], e["layers"], len(e["heads"])) for e in entries]
        [('0', [0, 1, 2, 3, 4, 5], 12), ('1', [0, 1, 2, 3, 4, 5], 12)]
    """
    if not maps:
        raise InputError("no attention maps to export")
    entries = [{
        "example_id": amap.example_id,
        "kind": amap.kind,
        "stack": amap.stack,
        "layers": list(amap.layers),
        "heads": list(amap.heads),
        "attention": bertviz_json(amap),
    } for amap in maps]
    text = json.dumps(entries)
    return atomic_write(path, lambda part: part.write_text(text))
