"""Compact, safely embeddable attention data for reports.

Weights are quantised to ``uint8`` (``round(w * 255)``), so a decoded weight ``q / 255`` is
within half a step, ``1/510``, of the original. Each map's ``[layer, head, query, key]`` bytes
are base64-encoded (C order); tokens travel as JSON strings. JSON placed inside
``<script type="application/json">`` has ``<``, ``>``, ``&``, U+2028 and U+2029 written as
``\\u003c`` etc., so no token can close the script element or start markup; bidirectional
control characters are escaped the same way.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnprobe.report.text import BIDI_CONTROLS
from attnprobe.types import AttentionMap

MAX_ERROR = 1 / 510  # largest |decoded - original| for weights in [0, 1]
_JSON_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                               "\u2028": "\\u2028", "\u2029": "\\u2029",
                               # bidi controls would reorder the page source around them
                               **{c: f"\\u{ord(c):04x}" for c in BIDI_CONTROLS}})


def quantise(weights: np.ndarray) -> np.ndarray:
    """Weights in [0, 1] as uint8 steps of 1/255 (max error 1/510)."""
    return np.clip(np.rint(np.asarray(weights, dtype=np.float64) * 255.0), 0, 255).astype(np.uint8)


def dequantise(data: np.ndarray) -> np.ndarray:
    return np.asarray(data, dtype=np.float32) / 255.0


def pack_map(amap: AttentionMap, index: int = 0) -> dict[str, Any]:
    """One map as a JSON-ready dict: shape, model indices, tokens, base64 uint8 weights and
    ``prompt_length`` (``null`` unless the map covers generated tokens, which the view
    marks)."""
    pattern = amap.pattern.numpy()
    return {
        "prompt_length": amap.prompt_length,
        "id": amap.example_id or f"sentence {index}",
        "stack": amap.stack, "kind": amap.kind,
        "layers": list(amap.layers), "heads": list(amap.heads or ()),
        "shape": [int(s) for s in pattern.shape],
        # tokens as people read them (Ġwooden -> " wooden"); the raw ones stay in the maps
        "query_tokens": list(amap.readable_tokens("query")),
        "key_tokens": list(amap.readable_tokens("key")),
        "data": base64.b64encode(np.ascontiguousarray(quantise(pattern)).tobytes()).decode("ascii"),
    }


def pack_maps(maps: Sequence[AttentionMap]) -> list[dict[str, Any]]:
    return [pack_map(m, i) for i, m in enumerate(maps)]


def unpack_weights(packed: dict[str, Any]) -> np.ndarray:
    """The float weights ``[layer, head, query, key]`` of a packed map (inverse of packing)."""
    raw = np.frombuffer(base64.b64decode(packed["data"]), dtype=np.uint8)
    return dequantise(raw.reshape(packed["shape"]))


def escape_json(obj: Any) -> str:
    """JSON text safe to place inside a ``<script>`` element."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_JSON_ESCAPES)


def read_script_json(html: str, element_id: str) -> Any:
    """The object a page embeds as ``<script type="application/json" id=element_id>`` (for
    tests and tools)."""
    start_tag = f'<script type="application/json" id="{element_id}">'
    start = html.index(start_tag) + len(start_tag)
    return json.loads(html[start:html.index("</script>", start)])
