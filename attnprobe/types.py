"""Core data: one example's attention maps, and what produced them.

Conventions (shared by every module):
- ``pattern`` is post-softmax weights, ``scores`` pre-softmax logits.
- Axis order is ``[layer, head, query, key]``; ``layers`` holds *model* layer indices, so
  selecting a subset never renumbers them.
- Head labels read ``L{layer}H{head}``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from attnprobe.core.divergence import row_sum_tolerance
from attnprobe.core.scope import head_id
from attnprobe.errors import InputError

__all__ = ["ATTRIBUTION_COLUMNS", "MAP_COLUMNS", "AttentionMap", "ModelInfo", "TokenAttribution",
           "head_id", "load_maps", "save_maps"]

Kind = Literal["self", "cross"]

# Tidy column names of AttentionMap.to_frame(); reports and analyses rely on them.
MAP_COLUMNS = (
    "example_id", "stack", "kind", "layer", "head", "head_id",
    "query_pos", "key_pos", "query_token", "key_token", "weight",
)
FORMAT_VERSION = 1
# Tidy column names of TokenAttribution.to_frame().
ATTRIBUTION_COLUMNS = ("example_id", "method", "target", "position", "token", "score")



@dataclass(frozen=True)
class ModelInfo:
    """What model produced a map and how (enough to reproduce it)."""

    name: str
    arch: str
    n_layers: int
    n_heads: int
    causal: bool | None  # None: unknown (a plain module with no config)
    attn_implementation: str = "unknown"
    dtype: str = "float32"
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelInfo:
        return cls(**data)


def _indices(name: str, wanted: int | list[int] | tuple[int, ...] | None,
             available: tuple[int, ...]) -> list[int]:
    """Positions of ``wanted`` model indices inside ``available``; one-line error otherwise."""
    if wanted is None:
        return list(range(len(available)))
    wanted = [wanted] if isinstance(wanted, int) else list(wanted)
    if not wanted or len(set(wanted)) != len(wanted) or any(
            isinstance(w, bool) or not isinstance(w, int) for w in wanted):
        raise InputError(f"{name} must be distinct integers (None for all); got {wanted}")
    missing = [w for w in wanted if w not in available]
    if missing:
        raise InputError(f"{name} {missing} not available; this map has {name} {list(available)}")
    return [available.index(w) for w in wanted]


@dataclass(frozen=True, eq=False)
class AttentionMap:
    """Attention of one example, padding stripped.

    Args:
        pattern: float tensor ``[layer, head, query, key]``, rows sum to 1 (post-softmax).
        query_tokens / key_tokens: one string per query / key position.
        layers: model layer index of each entry on axis 0.
        heads: model head index of each entry on axis 1 (all heads when ``None``).
        info: the model that produced it.
        kind: ``"self"`` or ``"cross"`` attention.
        stack: which attention stack of the model (e.g. ``encoder``, ``decoder``) — the
            module path prefix for HF models.
        scores: optional pre-softmax logits, same shape as ``pattern``.
        example_id: free label carried into tables.
        check_rows: verify every row sums to 1 (turn off for edited maps).
    """

    pattern: torch.Tensor
    query_tokens: tuple[str, ...]
    key_tokens: tuple[str, ...]
    layers: tuple[int, ...]
    info: ModelInfo
    heads: tuple[int, ...] | None = None
    kind: Kind = "self"
    stack: str = ""
    scores: torch.Tensor | None = None
    example_id: str = ""
    check_rows: bool = True

    def __post_init__(self) -> None:
        pattern = self.pattern.detach().to("cpu", torch.float32)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "query_tokens", tuple(str(t) for t in self.query_tokens))
        object.__setattr__(self, "key_tokens", tuple(str(t) for t in self.key_tokens))
        object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))
        heads = tuple(range(pattern.shape[1])) if self.heads is None and pattern.ndim == 4 \
            else tuple(int(h) for h in (self.heads or ()))
        object.__setattr__(self, "heads", heads)
        self._validate()
        if self.scores is not None:
            object.__setattr__(self, "scores", self.scores.detach().to("cpu", torch.float32))
            if self.scores.shape != pattern.shape:
                raise InputError(f"scores shape {tuple(self.scores.shape)} != pattern shape "
                                 f"{tuple(pattern.shape)}")

    def _validate(self) -> None:
        p = self.pattern
        if p.ndim != 4:
            raise InputError("pattern must be 4-D [layer, head, query, key]; got shape "
                             f"{tuple(p.shape)}")
        expected = (len(self.layers), len(self.heads), len(self.query_tokens), len(self.key_tokens))
        if tuple(p.shape) != expected:
            raise InputError(f"pattern shape {tuple(p.shape)} does not match [layers, heads, "
                             f"query tokens, key tokens] = {expected}")
        if len(self.query_tokens) == 0 or len(self.key_tokens) == 0:
            raise InputError("an attention map needs at least one query and one key token")
        if not isinstance(self.info, ModelInfo):
            raise InputError(f"info must be a ModelInfo; got {type(self.info).__name__}")
        for name, values in (("layers", self.layers), ("heads", self.heads)):
            if len(set(values)) != len(values) or any(v < 0 for v in values):
                raise InputError(f"{name} must be distinct non-negative indices; got {values}")
        if self.kind not in ("self", "cross"):
            raise InputError(f"kind must be 'self' or 'cross'; got {self.kind!r}")
        row_sums = p.sum(-1)  # any NaN or inf in a row shows in its sum
        if not torch.isfinite(row_sums).all():
            raise InputError("pattern contains NaN or inf (a fully masked query row?)")
        if self.check_rows:
            if (p < 0).any():
                raise InputError("pattern has negative weights; pass check_rows=False for "
                                 "edited maps")
            worst = (row_sums - 1).abs().max().item()
            tolerance = row_sum_tolerance(self.info.dtype)
            if worst > tolerance:
                raise InputError(f"pattern rows must sum to 1 (worst deviation {worst:.3g}, "
                                 f"allowed {tolerance:.3g} in {self.info.dtype}); pass "
                                 "check_rows=False for edited maps")

    # ----------------------------------------------------------------- views
    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.pattern.shape)  # type: ignore[return-value]

    def head(self, layer: int, head: int) -> torch.Tensor:
        """``[query, key]`` weights of one head, by model indices."""
        li = _indices("layers", layer, self.layers)[0]
        hi = _indices("heads", head, self.heads)[0]
        return self.pattern[li, hi]

    def select(self, layers: int | list[int] | None = None,
               heads: int | list[int] | None = None) -> AttentionMap:
        """A new map restricted to the given model layer / head indices."""
        li = _indices("layers", layers, self.layers)
        hi = _indices("heads", heads, self.heads)
        pick = (torch.tensor(li, dtype=torch.long)[:, None],
                torch.tensor(hi, dtype=torch.long)[None, :])
        return replace(
            self,
            pattern=self.pattern[pick],
            scores=None if self.scores is None else self.scores[pick],
            layers=tuple(self.layers[i] for i in li),
            heads=tuple(self.heads[i] for i in hi),
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, head, query, key) cell; columns ``MAP_COLUMNS``."""
        n_l, n_h, n_q, n_k = self.shape
        grid = np.indices((n_l, n_h, n_q, n_k)).reshape(4, -1)
        layers = np.asarray(self.layers)[grid[0]]
        heads = np.asarray(self.heads)[grid[1]]
        return pd.DataFrame({
            "example_id": self.example_id,
            "stack": self.stack,
            "kind": self.kind,
            "layer": layers,
            "head": heads,
            "head_id": [head_id(layer, h) for layer, h in zip(layers, heads, strict=True)],
            "query_pos": grid[2],
            "key_pos": grid[3],
            "query_token": np.asarray(self.query_tokens, dtype=object)[grid[2]],
            "key_token": np.asarray(self.key_tokens, dtype=object)[grid[3]],
            "weight": self.pattern.numpy().reshape(-1),
        }, columns=list(MAP_COLUMNS))

    # ------------------------------------------------------------ save/load
    def _meta(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "query_tokens": list(self.query_tokens),
            "key_tokens": list(self.key_tokens),
            "layers": list(self.layers),
            "heads": list(self.heads),
            "kind": self.kind,
            "stack": self.stack,
            "example_id": self.example_id,
            "check_rows": self.check_rows,
            "info": self.info.to_dict(),
        }

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (.npz, tensors) and ``path`` with .json (everything else). No pickle."""
        return save_maps([self], path)

    @classmethod
    def load(cls, path: str | Path) -> AttentionMap:
        maps = load_maps(path)
        if len(maps) != 1:
            raise InputError(f"{path} holds {len(maps)} maps; use attnprobe.load_maps")
        return maps[0]


@dataclass(frozen=True)
class TokenAttribution:
    """How much each input token matters for one example and one target, by one method.

    Args:
        scores: float tensor ``[token]``, one score per input token (signed, as the method
            gives it; attention views are non-negative).
        tokens: the input tokens, one per score.
        method: what produced the scores, e.g. ``integrated_gradients`` or ``rollout@L3``.
        target: what the scores explain, e.g. ``class:1`` or ``similarity:<text>``.
        example_id: free label carried into tables.
        delta: the method's convergence error when it has one (Integrated Gradients:
            ``|Σ attributions - (f(x) - f(baseline))|``), else ``None``.
    """

    scores: torch.Tensor
    tokens: tuple[str, ...]
    method: str
    target: str
    example_id: str = ""
    delta: float | None = None

    def __post_init__(self) -> None:
        scores = torch.as_tensor(self.scores).detach().to("cpu", torch.float64).flatten()
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "tokens", tuple(str(t) for t in self.tokens))
        if len(scores) != len(self.tokens):
            raise InputError(f"{len(scores)} scores for {len(self.tokens)} tokens "
                             f"({self.method}, example {self.example_id!r})")
        if not torch.isfinite(scores).all():
            raise InputError(f"{self.method} gave NaN or inf scores for example "
                             f"{self.example_id!r}")

    def to_frame(self) -> pd.DataFrame:
        """One row per token; columns ``ATTRIBUTION_COLUMNS``."""
        n = len(self.tokens)
        return pd.DataFrame({"example_id": [self.example_id] * n, "method": [self.method] * n,
                             "target": [self.target] * n, "position": range(n),
                             "token": list(self.tokens), "score": self.scores.numpy()},
                            columns=list(ATTRIBUTION_COLUMNS))


def _paths(path: str | Path) -> tuple[Path, Path]:
    path = Path(path)
    npz = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
    return npz, npz.with_suffix(".json")


def save_maps(maps: list[AttentionMap], path: str | Path) -> Path:
    """Save several maps to one ``.npz`` (float32 arrays) plus a ``.json`` sidecar."""
    if not maps:
        raise InputError("no attention maps to save")
    npz, meta = _paths(path)
    npz.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for i, amap in enumerate(maps):
        arrays[f"pattern_{i}"] = amap.pattern.numpy()
        if amap.scores is not None:
            arrays[f"scores_{i}"] = amap.scores.numpy()
    np.savez_compressed(npz, **arrays)
    meta.write_text(json.dumps({"maps": [m._meta() for m in maps]}, indent=1))
    return npz


def load_maps(path: str | Path) -> list[AttentionMap]:
    """Inverse of :func:`save_maps`; never unpickles."""
    npz, meta = _paths(path)
    if not npz.exists() or not meta.exists():
        raise InputError(f"expected {npz} and {meta}")
    spec = json.loads(meta.read_text())
    with np.load(npz, allow_pickle=False) as arrays:
        maps = []
        for i, m in enumerate(spec["maps"]):
            if m.get("format_version") != FORMAT_VERSION:
                raise InputError(f"{meta}: unsupported format_version {m.get('format_version')}")
            scores = arrays[f"scores_{i}"] if f"scores_{i}" in arrays else None
            maps.append(AttentionMap(
                pattern=torch.from_numpy(arrays[f"pattern_{i}"].copy()),
                scores=None if scores is None else torch.from_numpy(scores.copy()),
                query_tokens=tuple(m["query_tokens"]),
                key_tokens=tuple(m["key_tokens"]),
                layers=tuple(m["layers"]),
                heads=tuple(m["heads"]),
                kind=m["kind"],
                stack=m["stack"],
                example_id=m["example_id"],
                check_rows=m["check_rows"],
                info=ModelInfo.from_dict(m["info"]),
            ))
    return maps

