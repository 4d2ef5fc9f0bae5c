"""Q-, K- and V-composition between heads, from the weights (Elhage et al. 2021).

Follows [causal methods](../guide/causal-methods.md#composition-scores), in the **row
vector** convention of :mod:`attnprobe.heads.qk_ov` (``x @ W``; norms folded as there). A
writer head ``A`` in an earlier layer writes ``y @ W_OV^A`` into the residual; a reader head
``B`` in a later layer reads it through its query, key or value:

======  ==========================================  ============================================
kind    the reader's input                           score
======  ==========================================  ============================================
``q``   query ``x_q = y W_OV^A``                     ``‖W_OV^A W_QK^B‖ / (‖W_OV^A‖ ‖W_QK^B‖)``
``k``   key ``x_k = y W_OV^A``                       ``‖W_QK^B (W_OV^A)ᵀ‖ / (‖W_OV^A‖ ‖W_QK^B‖)``
``v``   value ``x_v = y W_OV^A``                     ``‖W_OV^A W_OV^B‖ / (‖W_OV^A‖ ‖W_OV^B‖)``
======  ==========================================  ============================================

(Frobenius norms; the same numbers as Elhage et al.'s column-vector ``‖W_QKᵀ W_OV‖``,
``‖W_QK W_OV‖``, ``‖W_OV^B W_OV^A‖``, since a norm is unchanged by transposition.) Every norm is
computed from ``[d_head, d_head]`` Gram matrices of the factors, never from a ``d_model ×
d_model`` product: for ``X = L C R``, ``‖X‖² = Σ (LᵀL C) ⊙ (C RRᵀ)``.

**Baseline**: the same score for random matrices of the same shapes (independent standard
Gaussians, seeded; the mean over ``n_draws`` writers × ``n_draws`` readers), computed, not
assumed; a pair composes when its score stands well above it. GQA/MQA: each query head reads
through its shared key/value head. RoPE models (``rope``): the weight-based Q- and
K-composition ignore the rotation and are approximate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from attnprobe.core import html_view
from attnprobe.core.display import describe, grid
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError
from attnprobe.heads.qk_ov import Circuits, circuits
from attnprobe.weights.head_weights import HeadWeights

__all__ = ["COLUMNS", "KINDS", "Composition", "composition", "composition_matrix",
           "composition_scores", "random_baseline"]

KINDS = ("q", "k", "v")
COLUMNS = ["kind", "writer_layer", "writer_head", "reader_layer", "reader_head", "score",
           "baseline"]
DEFAULT_DRAWS = 32


def _gram(a: torch.Tensor) -> torch.Tensor:
    """``aᵀ a`` per head: ``[n, x, y] -> [n, y, y]``."""
    return a.transpose(-1, -2) @ a


def _square_norm(left_gram: torch.Tensor, right_gram: torch.Tensor) -> torch.Tensor:
    """``‖L R‖²`` per head from ``LᵀL`` and ``RRᵀ`` ``[n, r, r]``: ``[n]``."""
    return (left_gram * right_gram.transpose(-1, -2)).sum((-1, -2))


def composition_scores(kind: str, writer: HeadWeights, reader: HeadWeights) -> torch.Tensor:
    """``[writer head, reader head]`` ``kind``-composition scores (module docstring) between
    every head of ``writer`` and every head of ``reader`` (weights indexed by query head,
    :meth:`~attnprobe.weights.head_weights.HeadWeights.per_query_head`), in float64. A
    head whose circuit is zero scores NaN."""
    if kind not in KINDS:
        raise InputError(one_of("composition kind", kind, KINDS))
    V_A, O_A = writer.W_V.double(), writer.W_O.double()  # [a, d, dv], [a, dv, d]
    left = _gram(V_A)  # [a, dv, dv]
    ov_a = _square_norm(left, O_A @ O_A.transpose(-1, -2))  # ‖W_OV^A‖² [a]
    Q, K = reader.W_Q.double(), reader.W_K.double()  # [b, d, dk]
    if kind == "v":
        V_B, O_B = reader.W_V.double(), reader.W_O.double()
        into, right = V_B, O_B @ O_B.transpose(-1, -2)  # C = O_A V_B, R = W_O^B
        norm_b = _square_norm(_gram(V_B), right)
    else:
        into, other = (Q, K) if kind == "q" else (K, Q)  # q: X = V_A (O_A Q) Kᵀ
        right = _gram(other)  # RRᵀ for R = otherᵀ
        norm_b = _square_norm(_gram(Q), _gram(K))  # ‖W_QK^B‖²
    middle = torch.einsum("aim,bmj->abij", O_A, into)  # C [a, b, dv, dk]
    square = (torch.einsum("aik,abkj->abij", left, middle)
              * torch.einsum("abik,bkj->abij", middle, right)).sum((-1, -2))
    return square.clamp_min(0).sqrt() / (ov_a.sqrt()[:, None] * norm_b.sqrt()[None, :])


def _random_heads(n: int, shapes: tuple[int, int, int], generator: torch.Generator
                  ) -> HeadWeights:
    d_model, d_qk, d_v = shapes

    def draw(*size: int) -> torch.Tensor:
        return torch.randn(n, *size, generator=generator, dtype=torch.float64)
    return HeadWeights(draw(d_model, d_qk), draw(d_model, d_qk), draw(d_model, d_v),
                       draw(d_v, d_model))


def _shapes(w: HeadWeights) -> tuple[int, int, int]:
    return w.d_model, int(w.W_Q.shape[-1]), int(w.W_V.shape[-1])


def random_baseline(kind: str, writer: tuple[int, int, int], reader: tuple[int, int, int],
                    n_draws: int, seed: int) -> float:
    """The mean ``kind``-composition score of ``n_draws`` random writers × ``n_draws``
    random readers of the given ``(d_model, d_head of q/k, d_head of v)`` shapes."""
    generator = torch.Generator().manual_seed(seed)
    scores = composition_scores(kind, _random_heads(n_draws, writer, generator),
                                _random_heads(n_draws, reader, generator))
    return float(scores.mean())


def composition_matrix(table: pd.DataFrame, kind: str, value: str = "score") -> pd.DataFrame:
    """Writer heads (rows, ``L0H0`` ...) × reader heads (columns) of ``value`` (``score``,
    ``baseline`` or ``ratio`` = score / baseline) for one ``kind`` of a composition table;
    NaN where the reader is not in a later layer."""
    if value not in ("score", "baseline", "ratio"):
        raise InputError(one_of("composition value", value, ("score", "baseline", "ratio")))
    rows = table[table["kind"] == kind]
    if rows.empty:
        kinds = list(dict.fromkeys(table["kind"].astype(str)))
        raise InputError(f"the composition table has no {kind!r} rows; it has {kinds}")
    values = rows["score"] / rows["baseline"] if value == "ratio" else rows[value]
    writers = "L" + rows["writer_layer"].astype(str) + "H" + rows["writer_head"].astype(str)
    readers = "L" + rows["reader_layer"].astype(str) + "H" + rows["reader_head"].astype(str)
    frame = pd.DataFrame({"writer": writers, "reader": readers, "value": values})
    return frame.pivot(index="writer", columns="reader", values="value").reindex(
        index=list(dict.fromkeys(writers)), columns=list(dict.fromkeys(readers)))


@dataclass(frozen=True, eq=False)
class Composition:
    """Composition scores between every earlier-layer head and every later-layer head.

    Attributes:
        table: one row per kind and (writer, reader) pair (:data:`COLUMNS`).
        model: the model's name; n_layers / n_heads its grid.
        kinds: the kinds computed; n_draws / seed: the random baseline's draws.
        rope: the model rotates q/k (Q- and K-composition are approximate).
        notes: what else the weight-based reading misses.
    """

    table: pd.DataFrame
    model: str
    n_layers: int
    n_heads: int
    kinds: tuple[str, ...]
    n_draws: int
    seed: int
    rope: bool
    notes: tuple[str, ...]

    def baseline(self, kind: str) -> float:
        """The random baseline of ``kind`` (the mean when layers differ in shape)."""
        return float(self._rows(kind)["baseline"].mean())

    def _rows(self, kind: str) -> pd.DataFrame:
        if kind not in self.kinds:
            raise InputError(one_of("composition kind", kind, self.kinds))
        return self.table[self.table["kind"] == kind]

    def matrix(self, kind: str, value: str = "score") -> pd.DataFrame:
        """Writer heads × reader heads of ``value`` (:func:`composition_matrix`)."""
        self._rows(kind)
        return composition_matrix(self.table, kind, value)

    def _repr_html_(self) -> str | None:
        """A writer × reader heatmap per kind and the table (:mod:`attnprobe.report`)."""
        return html_view.html(self, "composition")

    def __repr__(self) -> str:
        base = " ".join(f"{k} {self.baseline(k):.3f}" for k in self.kinds)
        top = None
        if len(self.table):
            ratio = self.table["score"] / self.table["baseline"]
            best = self.table.loc[ratio.idxmax()]
            top = (f"top {best['kind']}: L{best['writer_layer']}H{best['writer_head']}→"
                   f"L{best['reader_layer']}H{best['reader_head']} {best['score']:.3f}")
        return describe("Composition", self.model, grid(self.n_layers, self.n_heads),
                        f"baseline {base}", top, "RoPE: q/k approximate" if self.rope else None)


def composition(model: nn.Module | Circuits, *, kinds: Sequence[str] = KINDS,
                n_draws: int = DEFAULT_DRAWS, seed: int = 0) -> Composition:
    """Q-, K- and V-composition scores between every head and every head of a later layer,
    with their random baseline (module docstring;
    [causal methods](../guide/causal-methods.md#composition-scores)).

    Args:
        model: a model whose layout attnprobe knows (:func:`attnprobe.heads.circuits`), or
            its :class:`~attnprobe.heads.qk_ov.Circuits` (not read again).
        kinds: any of ``"q"``, ``"k"``, ``"v"``.
        n_draws: random writers and readers drawn for the baseline (``n_draws²`` pairs).
        seed: seeds the baseline's draws.

    Returns:
        :class:`Composition`: ``.table`` (:data:`COLUMNS`), ``.matrix(kind)``,
        ``.baseline(kind)``.

    Example:
        >>> comp = ap.heads.composition(lm)             # pre-norm: 2 layers × 4 heads
        >>> comp.matrix("k", "ratio").shape  # K-composition over the baseline, writer × reader
        (4, 4)
        >>> len(comp.table)                             # 3 kinds × 4 writers × 4 readers
        48
    """
    kinds = tuple(dict.fromkeys(kinds))
    for kind in kinds:
        if kind not in KINDS:
            raise InputError(one_of("composition kind", kind, KINDS))
    if not kinds:
        raise InputError("kinds must name at least one of 'q', 'k', 'v'")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 2:
        raise InputError(f"n_draws must be an integer >= 2; got {n_draws!r}")
    found = model if isinstance(model, Circuits) else circuits(model)
    if found.n_layers < 2:
        raise InputError(f"{found.model} has {found.n_layers} layer; composition needs a "
                         "later layer to read what an earlier one wrote")
    frames, baselines = [], {}
    for kind in kinds:
        for a, writer in enumerate(found.layers):
            for b in range(a + 1, found.n_layers):
                reader = found.layers[b]
                key = (kind, _shapes(writer), _shapes(reader))
                if key not in baselines:
                    baselines[key] = random_baseline(kind, key[1], key[2], n_draws, seed)
                scores = composition_scores(kind, writer, reader)  # [writer, reader]
                heads_a, heads_b = torch.meshgrid(torch.arange(scores.shape[0]),
                                                  torch.arange(scores.shape[1]), indexing="ij")
                frames.append(pd.DataFrame({
                    "kind": kind, "writer_layer": a, "writer_head": heads_a.reshape(-1).numpy(),
                    "reader_layer": b, "reader_head": heads_b.reshape(-1).numpy(),
                    "score": scores.reshape(-1).numpy(), "baseline": baselines[key]}))
    return Composition(pd.concat(frames, ignore_index=True)[COLUMNS], found.model,
                       found.n_layers, found.n_heads, kinds, n_draws, seed, found.rope,
                       found.notes)
