"""QK and OV circuits of every head, read from the weights (Elhage et al. 2021).

Follows [causal methods](../guide/causal-methods.md#qk-and-ov-circuits). **Row vectors**
throughout (``x @ W``, TransformerLens' convention; :mod:`attnprobe.weights.head_weights`):

- ``W_QK[h] = W_Q[h] @ W_K[h]ᵀ`` ``[d_model, d_model]``: the score of query residual ``x_q``
  on key residual ``x_k`` is ``x_q @ W_QK @ x_kᵀ`` (before the ``1/sqrt(d_head)`` scale);
- ``W_OV[h] = W_V[h] @ W_O[h]`` ``[d_model, d_model]``: what the head writes when it attends
  to ``x`` is ``x @ W_OV``.

Both are kept **factored** (:class:`Factored`: ``left [d_model, d_head] @ right [d_head,
d_model]``); the ``d_model × d_model`` product is formed only by ``.full()``, and the ``vocab ×
vocab`` circuits through the embedding and unembedding only by :meth:`Circuits.full_ov` /
:meth:`Circuits.full_qk`.

**Folded norms**, as TransformerLens' ``from_pretrained`` processes weights: each layer's
pre-attention norm weight is folded into ``W_Q``, ``W_K``, ``W_V`` (its bias into their biases)
and, for LayerNorm models, the reading weights are centred over ``d_model``
(``fold_ln``) and ``W_O``, ``W_E`` centred too (``center_writing_weights``); the final norm's
weight is folded into ``W_U``. The unembedding is not centred over the vocabulary.

**GQA / MQA**: every query head is paired with the key/value head it shares (``kv_head``).
**RoPE** (``rope``) rotates q and k by position, so the real QK circuit depends on the offset;
the weight-based one ignores the rotation and is approximate for such models (``notes`` lists
what else a weight-based reading misses).

**OV copying score** (Elhage et al.): the eigenvalues ``λ`` of ``W_E @ W_OV @ W_U``
(``[vocab, vocab]``) summarised as ``Σλ / Σ|λ|`` (``copying_score``, in [-1, 1]; 1 when every
eigenvalue is positive: the head copies the token it attends to) and as the share of
``Σ|λ|`` on eigenvalues with a positive real part (``positive_share``, in [0, 1]). The non-zero
eigenvalues of ``AB`` are those of ``BA``, so they come from the ``[d_head, d_head]`` matrix
``W_O (W_U W_E) W_V``, never from the vocabulary-sized product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from attnprobe.core import html_view
from attnprobe.core.display import describe, grid
from attnprobe.errors import InputError
from attnprobe.weights.anatomy import Anatomy, anatomy
from attnprobe.weights.head_weights import HeadWeights

__all__ = ["COLUMNS", "MAX_FULL", "Circuits", "Factored", "circuits", "copying_scores",
           "folded_weights"]

COLUMNS = ["layer", "head", "kv_head", "qk_norm", "ov_norm", "copying_score",
           "positive_share"]
MAX_FULL = 2 ** 26  # entries of a vocab × vocab circuit formed without naming tokens


@dataclass(frozen=True)
class Factored:
    """A ``[d_model, d_model]`` matrix kept as ``left @ right`` (row vectors: ``x ↦ x @ left
    @ right``). ``left [d_model, r]``, ``right [r, d_model]``."""

    left: torch.Tensor
    right: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.left.shape[0]), int(self.right.shape[1])

    def full(self) -> torch.Tensor:
        """The product ``[d_model, d_model]``."""
        return self.left @ self.right

    def norm(self) -> float:
        """Frobenius norm from the ``[r, r]`` Gram matrices: ``tr(LᵀL · RRᵀ)^½``."""
        left, right = self.left.double(), self.right.double()
        square = ((left.T @ left) * (right @ right.T)).sum()
        return float(square.clamp_min(0).sqrt())

    def eigenvalues(self) -> torch.Tensor:
        """The (at most ``r``) non-zero eigenvalues, from ``right @ left`` ``[r, r]``
        (complex)."""
        return torch.linalg.eigvals(self.right.double() @ self.left.double())

    def __repr__(self) -> str:
        d_in, d_out = self.shape
        return f"Factored({d_in} × {d_out}, rank ≤ {self.left.shape[1]})"


def folded_weights(parts: Anatomy) -> tuple[HeadWeights, ...]:
    """Every layer's head weights with its norm folded (module docstring), float32 on the
    CPU, indexed by query head (shared K/V repeated)."""
    centre = parts.final_spec.centred
    return tuple(layer.weights().to(torch.float32).folded(parts.norm_spec(layer.index),
                                                          centre_output=centre)
                 .per_query_head() for layer in parts.layers)


def _readout(parts: Anatomy) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``W_E [vocab, d_model]`` (centred for LayerNorm models) and ``W_U [d_model, vocab]``
    with the final norm's weight folded (None without an LM head), float32 on the CPU."""
    spec = parts.final_spec
    W_E = parts.embedding().to("cpu", torch.float32)
    if spec.centred:
        W_E = W_E - W_E.mean(-1, keepdim=True)
    if parts.unembed is None:
        return W_E, None
    W_U = parts.unembedding()[0].to("cpu", torch.float32) * spec.weight.float()[:, None]
    return W_E, W_U - W_U.mean(0, keepdim=True) if spec.centred else W_U


def copying_scores(layers: Sequence[HeadWeights], W_E: torch.Tensor, W_U: torch.Tensor
                   ) -> pd.DataFrame:
    """``copying_score`` and ``positive_share`` (module docstring) of every head:
    ``layer, head, copying_score, positive_share``. Embedding and unembedding vocabularies
    of different sizes are matched on their common first tokens; a head whose OV circuit is
    zero scores NaN."""
    vocab = min(W_E.shape[0], W_U.shape[1])
    between = W_U[:, :vocab].double() @ W_E[:vocab].double()  # [d_model, d_model]
    rows = []
    for i, w in enumerate(layers):
        small = w.W_O.double() @ between @ w.W_V.double()  # [head, d_head, d_head]
        eig = torch.linalg.eigvals(small)  # [head, d_head]
        size = eig.abs().sum(-1)
        score = eig.sum(-1).real / size
        positive = (eig.abs() * (eig.real > 0)).sum(-1) / size
        rows += [(i, h, float(score[h]), float(positive[h])) for h in range(w.n_heads)]
    return pd.DataFrame(rows, columns=["layer", "head", "copying_score", "positive_share"])


@dataclass(frozen=True, eq=False)
class Circuits:
    """The QK and OV circuits of every head of one model (module docstring).

    Attributes:
        model / family: the model's name and its anatomy family.
        layers: per layer the folded :class:`~attnprobe.weights.head_weights.HeadWeights`
            indexed by query head (``W_Q [head, d_model, d_head]`` ...).
        kv_heads: per layer, the key/value head each query head reads.
        W_E: ``[vocab, d_model]``; W_U: ``[d_model, vocab]`` or None (no LM head).
        rope: the model rotates q/k by position (the weight-based QK circuit ignores it).
        notes: what else makes the weight-based reading approximate.
        table: one row per head (:data:`COLUMNS`): Frobenius norms of ``W_QK`` and ``W_OV``
            and the copying scores (absent without an LM head).
    """

    model: str
    family: str
    layers: tuple[HeadWeights, ...]
    kv_heads: tuple[tuple[int, ...], ...]
    W_E: torch.Tensor
    W_U: torch.Tensor | None
    rope: bool
    notes: tuple[str, ...]
    table: pd.DataFrame

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        return max(w.n_heads for w in self.layers)

    @property
    def d_model(self) -> int:
        return self.layers[0].d_model

    def _head(self, layer: int, head: int) -> HeadWeights:
        if not 0 <= layer < self.n_layers:
            raise InputError(f"layer {layer} out of range; {self.model} has {self.n_layers} "
                             f"layers (0..{self.n_layers - 1})")
        w = self.layers[layer]
        if not 0 <= head < w.n_heads:
            raise InputError(f"head {head} out of range; layer {layer} has {w.n_heads} heads "
                             f"(0..{w.n_heads - 1})")
        return w

    def qk(self, layer: int, head: int) -> Factored:
        """``W_QK = W_Q @ W_Kᵀ`` of one head, factored (``[d_model, d_model]``)."""
        w = self._head(layer, head)
        return Factored(w.W_Q[head], w.W_K[head].T)

    def ov(self, layer: int, head: int) -> Factored:
        """``W_OV = W_V @ W_O`` of one head, factored (``[d_model, d_model]``)."""
        w = self._head(layer, head)
        return Factored(w.W_V[head], w.W_O[head])

    def _tokens(self, tokens: Sequence[int] | None, vocab: int) -> torch.Tensor:
        if tokens is None:
            if vocab * vocab > MAX_FULL:
                raise InputError(f"the full circuit would be {vocab} × {vocab}; pass "
                                 "tokens=[...] to form it on those tokens only")
            return torch.arange(vocab)
        index = torch.as_tensor(list(tokens), dtype=torch.long)
        if index.ndim != 1 or not len(index) or int(index.min()) < 0 \
                or int(index.max()) >= vocab:
            raise InputError(f"tokens must be ids in 0..{vocab - 1}; got {list(tokens)[:8]}")
        return index

    def full_ov(self, layer: int, head: int, tokens: Sequence[int] | None = None
                ) -> torch.Tensor:
        """``W_E @ W_OV @ W_U`` ``[token attended, token predicted]`` on ``tokens`` (all of
        the vocabulary when None and it is small enough: :data:`MAX_FULL`)."""
        if self.W_U is None:
            raise InputError(f"{self.model} has no unembedding; the full OV circuit needs one")
        ov = self.ov(layer, head)
        index = self._tokens(tokens, min(self.W_E.shape[0], self.W_U.shape[1]))
        return (self.W_E[index] @ ov.left) @ (ov.right @ self.W_U[:, index])

    def full_qk(self, layer: int, head: int, tokens: Sequence[int] | None = None
                ) -> torch.Tensor:
        """``W_E @ W_QK @ W_Eᵀ`` ``[query token, key token]`` on ``tokens`` (embeddings
        only: positions and RoPE ignored)."""
        qk = self.qk(layer, head)
        index = self._tokens(tokens, self.W_E.shape[0])
        embedded = self.W_E[index]
        return (embedded @ qk.left) @ (qk.right @ embedded.T)

    def _repr_html_(self) -> str | None:
        """Copying score per head and the table (:mod:`attnprobe.report`)."""
        return html_view.html(self, "circuits")

    def __repr__(self) -> str:
        copying = None
        if "copying_score" in self.table.columns and len(self.table):
            best = self.table.loc[self.table["copying_score"].idxmax()]
            copying = (f"top copying L{int(best['layer'])}H{int(best['head'])} "
                       f"{best['copying_score']:.2f}")
        kv = {len(set(k)) for k in self.kv_heads}
        shared = f"{max(kv)} KV heads" if max(kv) < self.n_heads else None
        return describe("Circuits", self.model, grid(self.n_layers, self.n_heads), shared,
                        f"d_model {self.d_model}", copying,
                        "RoPE: QK approximate" if self.rope else None)


def circuits(model: nn.Module) -> Circuits:
    """The QK and OV circuits of every head of ``model``, from its weights (module
    docstring; [causal methods](../guide/causal-methods.md#qk-and-ov-circuits)).

    Args:
        model: a pre-norm model whose layout attnprobe knows (:mod:`attnprobe.capture.
            anatomy`: GPT-2, LLaMA-layout decoders, the reference models).

    Returns:
        :class:`Circuits`: ``.qk(layer, head)`` / ``.ov(layer, head)`` factored,
        ``.full_ov`` / ``.full_qk`` through the embeddings when asked, ``.table`` with the
        copying scores.

    Example:
        >>> c = ap.heads.circuits(lm)                   # pre-norm: 2 layers × 4 heads
        >>> c.table.nlargest(4, "copying_score")     # the heads that copy what they read
        >>> c.ov(1, 0)                                  # W_OV [d_model, d_model], factored
        Factored(64 × 64, rank ≤ 16)
        >>> c.ov(1, 0).eigenvalues().shape              # one per rank (d_head = 64 / 4)
        torch.Size([16])
    """
    parts = anatomy(model)
    layers = folded_weights(parts)
    W_E, W_U = _readout(parts)
    kv_heads = tuple(tuple(h // (layer.n_heads // layer.n_kv_heads) for h in
                           range(layer.n_heads)) for layer in parts.layers)
    rows = []
    for i, w in enumerate(layers):
        for h in range(w.n_heads):
            rows.append((i, h, kv_heads[i][h], Factored(w.W_Q[h], w.W_K[h].T).norm(),
                         Factored(w.W_V[h], w.W_O[h]).norm()))
    table = pd.DataFrame(rows, columns=COLUMNS[:5])
    if W_U is not None:
        table = table.merge(copying_scores(layers, W_E, W_U), on=["layer", "head"])
    notes = (*(("RoPE rotates q and k by position: the weight-based QK circuit ignores "
                "it",) if parts.rope else ()), *parts.notes)
    return Circuits(parts.name, parts.family, layers, kv_heads, W_E, W_U, parts.rope, notes,
                    table)
