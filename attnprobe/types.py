"""Core data: one example's attention maps, and what produced them; saving and loading them
(:mod:`attnprobe.map_files`) and token attributions (:mod:`attnprobe.token_attribution`) are
re-exported here.

Conventions (shared by every module):
- ``pattern`` is post-softmax weights, ``scores`` pre-softmax logits.
- Axis order is ``[layer, head, query, key]``; ``layers`` holds *model* layer indices, so
  selecting a subset never renumbers them.
- Head labels read ``L{layer}H{head}``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from attnprobe.core import html_view
from attnprobe.core.display import counted, describe, grid, quoted
from attnprobe.core.divergence import row_sum_tolerance
from attnprobe.core.maps_format import is_maps_sidecar, maps_paths
from attnprobe.core.scope import head_id
from attnprobe.core.tokens import TOKEN_STYLES, guess_style, readable
from attnprobe.core.untrusted import DEFAULT_MAX_BYTES
from attnprobe.errors import InputError
from attnprobe.map_files import read_maps, save_maps
from attnprobe.token_attribution import ATTRIBUTION_COLUMNS, TokenAttribution

__all__ = ["ATTRIBUTION_COLUMNS", "MAP_COLUMNS", "AttentionMap", "ModelInfo", "TokenAttribution",
           "head_id", "is_maps_sidecar", "load_maps", "maps_paths", "save_maps"]

Kind = Literal["self", "cross"]

# Tidy column names of AttentionMap.to_frame(); reports and analyses rely on them.
MAP_COLUMNS = (
    "example_id", "stack", "kind", "layer", "head", "head_id",
    "query_pos", "key_pos", "query_token", "key_token", "weight",
)

@dataclass(frozen=True)
class ModelInfo:
    """What model produced a map and how (enough to reproduce it).

    ``token_style`` is how the tokenizer spells text in its token strings
    (:data:`attnprobe.core.tokens.TOKEN_STYLES`: ``byte_level``, ``metaspace`` ...), read from
    the tokenizer at capture so that maps loaded from files render their tokens the same;
    ``None`` when no tokenizer was given (then guessed from the tokens).
    """

    name: str
    arch: str
    n_layers: int
    n_heads: int
    causal: bool | None  # None: unknown (a plain module with no config)
    attn_implementation: str = "unknown"
    dtype: str = "float32"
    versions: dict[str, str] = field(default_factory=dict)
    token_style: str | None = None

    def __post_init__(self) -> None:
        if self.token_style is not None and self.token_style not in TOKEN_STYLES:
            raise InputError(f"token_style must be one of {', '.join(TOKEN_STYLES)} (or None); "
                             f"got {self.token_style!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __repr__(self) -> str:
        mask = {True: "causal", False: "bidirectional", None: "causal unknown"}[self.causal]
        return describe("ModelInfo", f"{self.name}: {self.arch}",
                        grid(self.n_layers, self.n_heads), mask, self.attn_implementation,
                        self.dtype)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelInfo:
        return cls(**data)


def _token_ids(name: str, ids: Any) -> tuple[int, ...]:
    """``ids`` as a tuple of non-negative ints, or a one-line error."""
    values = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else list(ids)
    if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0
           for i in values):
        raise InputError(f"{name} must be non-negative integers (token ids)")
    return tuple(int(i) for i in values)


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
        prompt_length: for a map captured during generation, how many leading query
            tokens were given (the prompt); the query tokens after them were generated
            (:attr:`generated`). ``None`` for a map of one forward.
        query_ids / key_ids: the token id of each query / key position (``None`` when
            unknown, e.g. learned pooling queries or a capture without input ids).
        learned_sink: the head gives part of each row's mass to a learned sink (a logit with
            no key: GPT-OSS, ...), so rows sum to at most 1; :attr:`sink_mass` is the rest.
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
    prompt_length: int | None = None
    query_ids: tuple[int, ...] | None = None
    key_ids: tuple[int, ...] | None = None
    learned_sink: bool = False

    def __post_init__(self) -> None:
        pattern = self.pattern.detach().to("cpu", torch.float32)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "query_tokens", tuple(str(t) for t in self.query_tokens))
        object.__setattr__(self, "key_tokens", tuple(str(t) for t in self.key_tokens))
        object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))
        heads = tuple(range(pattern.shape[1])) if self.heads is None and pattern.ndim == 4 \
            else tuple(int(h) for h in (self.heads or ()))
        object.__setattr__(self, "heads", heads)
        for name in ("query_ids", "key_ids"):
            ids = getattr(self, name)
            if ids is not None:
                object.__setattr__(self, name, _token_ids(name, ids))
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
        prompt = self.prompt_length
        if prompt is not None and (isinstance(prompt, bool) or not isinstance(prompt, int)
                                   or not 1 <= prompt <= len(self.query_tokens)):
            raise InputError(f"prompt_length must be an int in 1..{len(self.query_tokens)} "
                             f"(the query tokens); got {prompt!r}")
        for name, ids, tokens in (("query_ids", self.query_ids, self.query_tokens),
                                  ("key_ids", self.key_ids, self.key_tokens)):
            if ids is not None and len(ids) != len(tokens):
                raise InputError(f"{name} has {len(ids)} ids for {len(tokens)} tokens")
        if self.kind not in ("self", "cross"):
            raise InputError(f"kind must be 'self' or 'cross'; got {self.kind!r}")
        row_sums = p.sum(-1)  # any NaN or inf in a row shows in its sum
        if not torch.isfinite(row_sums).all():
            raise InputError("pattern contains NaN or inf (a fully masked query row?)")
        if self.check_rows:
            if (p < 0).any():
                raise InputError("pattern has negative weights; pass check_rows=False for "
                                 "edited maps")
            tolerance = row_sum_tolerance(self.info.dtype)
            if self.learned_sink:  # the learned sink takes the rest of each row
                worst = (row_sums - 1).clamp(min=0).max().item()
                if worst > tolerance:
                    raise InputError(f"pattern rows must sum to at most 1 with a learned sink "
                                     f"(worst excess {worst:.3g}, allowed {tolerance:.3g} in "
                                     f"{self.info.dtype})")
                return
            worst = (row_sums - 1).abs().max().item()
            if worst > tolerance:
                raise InputError(f"pattern rows must sum to 1 (worst deviation {worst:.3g}, "
                                 f"allowed {tolerance:.3g} in {self.info.dtype}); pass "
                                 "check_rows=False for edited maps")

    def __repr__(self) -> str:
        side = self.stack.split(".")[0]
        n_q, n_k = len(self.query_tokens), len(self.key_tokens)
        tokens = f"{n_q} query × {counted(n_k, 'key token')}" if self.kind == "cross" \
            or n_q != n_k else f"{n_q} × {counted(n_k, 'token')}"
        generated = None if self.prompt_length is None else \
            f"prompt {self.prompt_length} + {n_q - self.prompt_length} generated"
        return describe(
            "AttentionMap", self.info.name,
            f"{side} {self.kind}" if side in ("encoder", "decoder") else self.kind,
            grid(self.layers, self.heads, self.info.n_layers or None,
                 self.info.n_heads or None),
            tokens, generated, self.info.dtype, "with scores" if self.scores is not None else None,
            f"example {self.example_id!r}" if self.example_id else None,
            quoted(" ".join(self.readable_tokens()[:12]), 48))

    def _repr_html_(self) -> str | None:
        """Head view and model view in a notebook (:mod:`attnprobe.report.notebook`)."""
        return html_view.html(self, "attention_map")

    # ----------------------------------------------------------------- views
    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.pattern.shape)  # type: ignore[return-value]

    @property
    def token_style(self) -> str:
        """How the token strings spell text: as recorded at capture, else guessed from them
        (:func:`attnprobe.core.tokens.guess_style`)."""
        return self.info.token_style or guess_style((*self.query_tokens, *self.key_tokens))

    def readable_tokens(self, side: Literal["query", "key"] = "query") -> tuple[str, ...]:
        """The query (or key) tokens as people read them (``Ġwooden`` -> `` wooden``; see
        :func:`attnprobe.core.tokens.readable`); the raw strings stay in ``query_tokens``."""
        if side not in ("query", "key"):
            raise InputError(f"side must be 'query' or 'key'; got {side!r}")
        tokens = self.query_tokens if side == "query" else self.key_tokens
        return tuple(readable(tokens, self.token_style))

    @property
    def sink_mass(self) -> torch.Tensor:
        """``[layer, head, query]``: the mass each row gave to a learned sink (all 0 without
        one; :attr:`learned_sink`)."""
        if not self.learned_sink:
            return torch.zeros(self.pattern.shape[:-1])
        return (1 - self.pattern.sum(-1)).clamp(min=0)

    @property
    def generated(self) -> tuple[bool, ...]:
        """Per query token: whether it was generated (at or after ``prompt_length``)."""
        start = len(self.query_tokens) if self.prompt_length is None else self.prompt_length
        return tuple(i >= start for i in range(len(self.query_tokens)))

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
        """One row per (layer, head, query, key) cell; columns ``MAP_COLUMNS`` (tokens as
        people read them, :meth:`readable_tokens`), then ``query_id`` / ``key_id`` when the
        token ids are known."""
        n_l, n_h, n_q, n_k = self.shape
        grid = np.indices((n_l, n_h, n_q, n_k)).reshape(4, -1)
        layers = np.asarray(self.layers)[grid[0]]
        heads = np.asarray(self.heads)[grid[1]]
        frame = pd.DataFrame({
            "example_id": self.example_id,
            "stack": self.stack,
            "kind": self.kind,
            "layer": layers,
            "head": heads,
            "head_id": [head_id(layer, h) for layer, h in zip(layers, heads, strict=True)],
            "query_pos": grid[2],
            "key_pos": grid[3],
            "query_token": np.asarray(self.readable_tokens("query"), dtype=object)[grid[2]],
            "key_token": np.asarray(self.readable_tokens("key"), dtype=object)[grid[3]],
            "weight": self.pattern.numpy().reshape(-1),
        }, columns=list(MAP_COLUMNS))
        for column, ids, axis in (("query_id", self.query_ids, 2), ("key_id", self.key_ids, 3)):
            if ids is not None:
                frame[column] = np.asarray(ids, dtype=np.int64)[grid[axis]]
        return frame

    # ------------------------------------------------------------ save/load
    def save(self, path: str | Path) -> Path:
        """Write ``path`` (.npz, tensors) and ``path`` with .json (everything else). No pickle."""
        return save_maps([self], path)

    @classmethod
    def load(cls, path: str | Path) -> AttentionMap:
        maps = load_maps(path)
        if len(maps) != 1:
            raise InputError(f"{path} holds {len(maps)} maps; use attnprobe.load_maps")
        return maps[0]


def _map_of(entry: dict[str, Any], pattern: np.ndarray, scores: np.ndarray | None
            ) -> AttentionMap:
    """One saved map from its sidecar entry and arrays (:func:`attnprobe.map_files.read_maps`
    checked them)."""
    return AttentionMap(
        pattern=torch.from_numpy(pattern.astype(np.float32)),
        scores=None if scores is None else torch.from_numpy(scores.astype(np.float32)),
        query_tokens=tuple(entry["query_tokens"]), key_tokens=tuple(entry["key_tokens"]),
        layers=tuple(entry["layers"]), heads=tuple(entry["heads"]), kind=entry["kind"],
        stack=entry["stack"], example_id=entry["example_id"],
        check_rows=entry["check_rows"], info=ModelInfo.from_dict(entry["info"]),
        prompt_length=entry.get("prompt_length"), query_ids=entry.get("query_ids"),
        key_ids=entry.get("key_ids"), learned_sink=entry.get("learned_sink", False))


def load_maps(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[AttentionMap]:
    """Inverse of :func:`save_maps`; never unpickles, and checks before it loads.

    The sidecar is read and checked first; its recorded SHA-256 must match the ``.npz``;
    then the ``.npz``'s zip directory and ``.npy`` headers must declare exactly the arrays
    and shapes the sidecar describes, within ``max_bytes`` in total (default 1 GiB), before
    any array is inflated (see :mod:`attnprobe.core.untrusted`).

    Raises:
        InputError: the ``.npz`` or its ``.json`` sidecar is missing.
        FileFormatError: anything malformed, inconsistent or over ``max_bytes`` (one line).

    Example:
        >>> _ = save_maps(maps, "two_maps")
        >>> back = load_maps("two_maps")                # the same maps, float32
        >>> [tuple(m.pattern.shape) == tuple(a.pattern.shape) for m, a in zip(back, maps)]
        [True, True]
        >>> torch.equal(back[0].pattern, maps[0].pattern)
        True
    """
    return read_maps(path, _map_of, ModelInfo, max_bytes=max_bytes)
