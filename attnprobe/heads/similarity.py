"""Jensen–Shannon distance between heads (Clark et al. §6), mergeable, and head clustering.

Two heads are close when they put their attention in the same places on the same tokens:
``D(a, b)`` is the mean over query rows of ``JS(a_i, b_i)`` (natural log, so at most
``ln 2``), with each row smoothed as Clark does (``0.999 a + 0.001 / n``). Sums and the row
count are kept, so batches, processes and machines merge exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from attnprobe.capture.calls import BatchPatterns
from attnprobe.core.display import counted, describe
from attnprobe.core.divergence import entropy
from attnprobe.core.merging import Summable, trivial_merge
from attnprobe.core.optional import require
from attnprobe.core.scope import head_id
from attnprobe.errors import InputError

SMOOTHING = 0.001
# Pairwise work is done on chunks of about this many float32 elements.
_CHUNK_ELEMENTS = 1 << 24

HeadKey = tuple[str, str, int, int]  # (stack, kind, layer, head)


def _summed_entropy(p: torch.Tensor, positive: bool) -> torch.Tensor:
    """``Σ_rows -Σ_key p ln p`` of ``[..., row, key]`` rows, float64 ``[...]``. Strictly
    positive rows (smoothed ones) take the vectorised logarithm, several times faster than
    ``xlogy``'s ``0 ln 0`` guard."""
    per_row = -(p * p.log()).sum(-1) if positive else entropy(p)
    return per_row.sum(-1, dtype=torch.float64)


def pairwise_js(rows: torch.Tensor) -> torch.Tensor:
    """Summed JS divergence between every pair of heads.

    Args:
        rows: ``[head, row, key]`` distributions (each row sums to 1; zeros count as
            ``0 ln 0 = 0``).

    Returns:
        ``[head, head]`` float64: ``Σ_rows JS(rows[a], rows[b])``, symmetric, zero diagonal.
    """
    n_heads, n_rows, n_keys = rows.shape
    positive = bool((rows > 0).all())
    first, second = torch.triu_indices(n_heads, n_heads, offset=1)
    own = _summed_entropy(rows, positive)  # [head]: Σ_rows H(row)
    out = torch.zeros(n_heads, n_heads, dtype=torch.float64)
    step = max(1, _CHUNK_ELEMENTS // max(1, n_rows * n_keys))
    half = rows * 0.5  # exact (no subnormal weight): half[a] + half[b] == (rows[a] + rows[b]) / 2
    for start in range(0, len(first), step):
        a, b = first[start:start + step], second[start:start + step]
        mixed = _summed_entropy(half[a] + half[b], positive)  # [pairs]
        out[a, b] = (mixed - (own[a] + own[b]) / 2).clamp(min=0)
    return out + out.T


@dataclass
class HeadDistances(Summable):
    """Mergeable JS sums between heads. ``a + b`` adds sums and row counts exactly."""

    heads: tuple[HeadKey, ...] = ()
    sums: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.float64))
    rows: float = 0.0

    @classmethod
    def from_rows(cls, rows: torch.Tensor, key_valid: torch.Tensor,
                  heads: tuple[HeadKey, ...], smoothing: float = SMOOTHING) -> HeadDistances:
        """JS sums over query rows read out of a forward (no full maps needed).

        Args:
            rows: ``[head, row, key]`` float32 weights of the same query rows in every head
                (the heads of every layer, flattened).
            key_valid: ``[row, key]`` bool, each row's real keys (the smoothing is uniform
                over them).
            heads: ``(stack, kind, layer, head)`` of each of ``rows``' heads.
        """
        real = key_valid.to(torch.float32)
        uniform = real / real.sum(-1, keepdim=True).clamp(min=1)  # [row, key]
        smoothed = (1 - smoothing) * rows.to(torch.float32) + smoothing * uniform
        return cls(heads, pairwise_js(smoothed), float(rows.shape[1]))

    @classmethod
    def from_batch(cls, batch: BatchPatterns, smoothing: float = SMOOTHING,
                   max_rows: int | None = None) -> HeadDistances:
        """JS sums over the real query rows of one padded batch (all its layers and heads).

        ``max_rows``: use at most this many rows, evenly spaced over the batch's real rows
        (the pairwise cost grows with heads² × rows × keys); ``None`` uses every row.
        """
        pattern = batch.pattern  # [batch, layer, head, q, k]
        n_layers, n_heads, k_len = pattern.shape[1], pattern.shape[2], pattern.shape[4]
        b, q = batch.query_valid.nonzero(as_tuple=True)
        if max_rows is not None and len(b) > max_rows:
            keep = torch.linspace(0, len(b) - 1, max_rows).round().long()
            b, q = b[keep], q[keep]
        rows = pattern[b, :, :, q].to(torch.float32)  # [row, layer, head, k]
        keys = tuple((batch.stack, batch.kind, layer, head)
                     for layer in batch.layers for head in batch.heads)
        flat = rows.reshape(len(b), n_layers * n_heads, k_len).transpose(0, 1)
        return cls.from_rows(flat, batch.key_valid[b], keys, smoothing)

    def __repr__(self) -> str:
        n = len(self.heads)
        return describe("HeadDistances", counted(n, "head"), counted(n * (n - 1) // 2, "pair"),
                        counted(self.rows, "row"))

    def __add__(self, other: HeadDistances) -> HeadDistances:
        if not isinstance(other, HeadDistances):
            return NotImplemented
        if (trivial := trivial_merge(self, other, "head distances")) is not None:
            return trivial
        return HeadDistances(self.heads, self.sums + other.sums, self.rows + other.rows)

    def matrix(self) -> pd.DataFrame:
        """Square ``[head, head]`` table of mean JS per row (nats), indexed by head id."""
        if not self.rows:
            raise InputError("no attention rows were seen: nothing to compare")
        names = _names(self.heads)
        return pd.DataFrame((self.sums / self.rows).numpy(), index=names, columns=names)

    def to_frame(self) -> pd.DataFrame:
        """Tidy pairs: ``head_a, head_b, layer_a, head_a_index, layer_b, head_b_index, js``."""
        means = (self.sums / max(self.rows, 1.0)).tolist()
        names = _names(self.heads)
        rows = []
        for i, a in enumerate(self.heads):
            for j, b in enumerate(self.heads):
                if i < j:
                    rows.append((names[i], names[j], a[2], a[3], b[2], b[3], means[i][j]))
        return pd.DataFrame(rows, columns=["head_a", "head_b", "layer_a", "head_a_index",
                                           "layer_b", "head_b_index", "js"])


def _names(heads: tuple[HeadKey, ...]) -> list[str]:
    """``L3H5`` labels, as in every other table; prefixed with ``stack:kind:`` only when the
    heads come from several attention stacks (encoder-decoder models)."""
    several = len({key[:2] for key in heads}) > 1
    return [(f"{stack}:{kind}:" if several else "") + head_id(layer, head)
            for stack, kind, layer, head in heads]


def classical_mds(distances: np.ndarray, dims: int = 2) -> np.ndarray:
    """Torgerson's classical MDS: coordinates ``[n, dims]`` whose Euclidean distances best
    match ``distances`` (``[n, n]``, symmetric). Deterministic, unlike SMACOF."""
    n = len(distances)
    centre = np.eye(n) - np.full((n, n), 1 / n)
    gram = -0.5 * centre @ (distances ** 2) @ centre
    values, vectors = np.linalg.eigh(gram)
    order = np.argsort(values)[::-1][:dims]
    coords = vectors[:, order] * np.sqrt(np.clip(values[order], 0, None))
    signs = np.sign(coords[np.abs(coords).argmax(0), range(coords.shape[1])])  # fixed signs
    return coords * np.where(signs == 0, 1, signs)


def cluster_heads(distances: HeadDistances, n_clusters: int = 6) -> pd.DataFrame:
    """Group heads by behaviour: average-linkage clusters and a 2-D classical MDS embedding
    of the Jensen–Shannon distances (``sqrt`` of the divergence, a metric).

    Returns one row per head: ``head_id, stack, kind, layer, head, cluster, x, y``.
    Needs scipy (the ``report`` extra).

    Example:
        >>> census = ap.heads.census(lm, lm_tok, [prompt])   # keeps the head distances
        >>> groups = cluster_heads(census.sums.distances, n_clusters=3)
        >>> len(groups), bool(groups["cluster"].between(1, 3).all())  # 8 heads; 1..3
        (8, True)
        >>> groups[["head_id", "cluster", "x", "y"]]
    """
    hierarchy = require("scipy.cluster.hierarchy")
    spatial = require("scipy.spatial.distance")
    matrix = distances.matrix()
    n = len(matrix)
    if n < 2:
        raise InputError("clustering needs at least two heads")
    if not 1 <= n_clusters <= n:
        raise InputError(f"n_clusters must be between 1 and {n} (the number of heads)")
    values = np.sqrt(np.clip(matrix.to_numpy(), 0, None))
    values = (values + values.T) / 2
    np.fill_diagonal(values, 0.0)
    links = hierarchy.linkage(spatial.squareform(values, checks=False), method="average")
    labels = hierarchy.fcluster(links, t=n_clusters, criterion="maxclust")
    xy = classical_mds(values)
    rows = [(name, *key, int(c), float(x), float(y))
            for name, key, c, (x, y) in zip(matrix.index, distances.heads, labels, xy,
                                            strict=True)]
    return pd.DataFrame(rows, columns=["head_id", "stack", "kind", "layer", "head", "cluster",
                                       "x", "y"])
