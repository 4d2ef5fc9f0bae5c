"""Agreement between two importance vectors over the same tokens, and against known truth.

Rank agreement (Kendall τ, Jain & Wallace 2019; Spearman ρ, Abnar & Zuidema 2020) uses the
scores as given; top-k overlap, Jensen–Shannon divergence and the ground-truth scores use
magnitudes ``|score|`` (a token pushing the output down matters too).

Nothing here returns NaN silently: a constant vector has no ranking (scipy would give NaN), so
the rank correlations raise :class:`~attnprobe.errors.InputError` naming it; an all-zero vector
has no distribution, so :func:`jsd` and the mass share raise too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from attnprobe.core import divergence
from attnprobe.errors import InputError
from attnprobe.types import TokenAttribution

__all__ = ["agreement", "jsd", "kendall_tau", "spearman", "topk_overlap", "truth_scores"]

METRICS = ("kendall_tau", "spearman", "topk_overlap", "jsd")


def _vector(x: Any, name: str) -> np.ndarray:
    arr = x.detach().to("cpu", torch.float64).numpy() if isinstance(x, torch.Tensor) \
        else np.asarray(x, dtype=np.float64)
    arr = arr.reshape(-1)
    if arr.size == 0:
        raise InputError(f"{name} is empty")
    if not np.isfinite(arr).all():
        raise InputError(f"{name} contains NaN or inf")
    return arr


def _pair(a: Any, b: Any, names: tuple[str, str] = ("a", "b"),
          min_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    x, y = _vector(a, names[0]), _vector(b, names[1])
    if x.size != y.size:
        raise InputError(f"{names[0]} has {x.size} scores but {names[1]} has {y.size}")
    if x.size < min_size:
        raise InputError(f"need at least {min_size} tokens to compare; got {x.size}")
    return x, y


def _ranked_pair(a: Any, b: Any, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The pair a rank correlation needs: equal lengths, 2+ tokens, neither vector constant."""
    pair = _pair(a, b, names, min_size=2)
    for x, name in zip(pair, names, strict=True):
        if np.all(x == x[0]):
            raise InputError(f"{name} is constant ({x[0]:.4g} on all {x.size} tokens): it "
                             "ranks nothing, so a rank correlation is undefined")
    return pair


def kendall_tau(a: Any, b: Any, *, names: tuple[str, str] = ("a", "b")) -> tuple[float, float]:
    """Kendall τ-b between two score vectors and its two-sided p-value (``scipy.stats``).

    Raises:
        InputError: different lengths, fewer than 2 tokens, or a constant vector.

    Example:
        >>> kendall_tau([0.1, 0.5, 0.2, 0.9], [1, 3, 2, 4])[0]     # the same order
        1.0
        >>> kendall_tau([0.1, 0.5, 0.2, 0.9], [4, 2, 3, 1])[0]     # reversed
        -1.0
    """
    from scipy.stats import kendalltau

    x, y = _ranked_pair(a, b, names)
    res = kendalltau(x, y)
    return float(res.statistic), float(res.pvalue)


def spearman(a: Any, b: Any, *, names: tuple[str, str] = ("a", "b")) -> tuple[float, float]:
    """Spearman ρ (ties averaged) between two score vectors and its two-sided p-value.

    Raises:
        InputError: different lengths, fewer than 2 tokens, or a constant vector.

    Example:
        >>> spearman([1, 2, 3, 4], [1, 4, 9, 16])[0]    # any increasing function: ρ = 1
        1.0
        >>> spearman([1, 2, 3, 3], [5, 5, 5, 5])
        Traceback (most recent call last):
        attnprobe.errors.InputError: b is constant (5 on all 4 tokens): ...
    """
    from scipy.stats import spearmanr

    x, y = _ranked_pair(a, b, names)
    res = spearmanr(x, y)
    # with two tokens scipy's p-value is NaN (no degrees of freedom): report 1 (no evidence)
    p = float(res.pvalue)
    return float(res.statistic), p if math.isfinite(p) else 1.0


def _top(x: np.ndarray, k: int) -> set[int]:
    """Positions of the ``k`` largest ``|x|``; ties go to the earlier position."""
    return set(np.argsort(-np.abs(x), kind="stable")[:k].tolist())


def topk_overlap(a: Any, b: Any, k: int, *, names: tuple[str, str] = ("a", "b")) -> float:
    """Share of the ``k`` tokens with the largest ``|a|`` that are also among the ``k`` largest
    ``|b|`` (ties broken by position, earlier first). 1 = same top-k set, 0 = disjoint.

    Example:
        >>> topk_overlap([0.9, 0.1, 0.5, 0.0], [0.8, 0.7, 0.0, 0.1], k=2)   # {0, 2} vs {0, 1}
        0.5
        >>> topk_overlap([0.9, 0.1], [-0.9, 0.1], k=1)   # magnitudes: a negative score counts
        1.0
    """
    x, y = _pair(a, b, names)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= x.size:
        raise InputError(f"k must be an int in 1..{x.size}; got {k!r}")
    return len(_top(x, int(k)) & _top(y, int(k))) / int(k)


def _distribution(x: np.ndarray, name: str) -> np.ndarray:
    mag = np.abs(x)
    total = mag.sum()
    if total <= 0:
        raise InputError(f"{name} is zero on every token: it has no distribution to compare")
    return mag / total


def jsd(a: Any, b: Any, *, names: tuple[str, str] = ("a", "b")) -> float:
    """Jensen–Shannon divergence (natural log, so in ``[0, ln 2]``) between ``|a|`` and ``|b|``,
    each normalised to sum 1 (the divergence itself is :func:`attnprobe.core.divergence.jsd`).

    Example:
        >>> jsd([1.0, 3.0], [2.0, 6.0])                 # the same after normalising
        0.0
        >>> jsd([1.0, 0.0], [0.0, 2.0]) == math.log(2)  # disjoint: ln 2
        True
    """
    x, y = _pair(a, b, names)
    p, q = _distribution(x, names[0]), _distribution(y, names[1])
    value = float(divergence.jsd(torch.from_numpy(p), torch.from_numpy(q)))
    return min(value, math.log(2))  # rounding can pass ln 2 by an ulp on disjoint supports


def _mask(keep: Any, n: int) -> np.ndarray:
    mask = keep.detach().cpu().numpy() if isinstance(keep, torch.Tensor) else np.asarray(keep)
    mask = mask.reshape(-1)
    if mask.dtype != np.bool_:
        raise InputError(f"keep must be a boolean mask; got dtype {mask.dtype}")
    if mask.size != n:
        raise InputError(f"keep has {mask.size} entries for {n} tokens")
    return mask


def agreement(x: TokenAttribution, y: TokenAttribution, *, k: int | None = None,
              keep: Any = None) -> dict[str, tuple[float, float | None]]:
    """Every agreement metric between two attributions of the same tokens.

    Args:
        x, y: attributions over the same tokens (checked).
        k: top-k size (default ``max(1, round(0.2·n))`` of the compared tokens, capped at n).
        keep: boolean mask over the tokens; only ``True`` tokens are compared (e.g. drop
            special tokens). At least two must remain.

    Returns:
        ``{"kendall_tau": (τ, p), "spearman": (ρ, p), "topk_overlap": (share, None),
        "jsd": (divergence, None)}``.

    Raises:
        InputError: different tokens, fewer than 2 compared tokens, a constant or all-zero
            vector (named by its method).

    Example:
        >>> tokens = ("[CLS]", "a", "cat", "sat")
        >>> x = TokenAttribution(torch.tensor([0.0, 0.1, 0.5, 0.2]), tokens, "x", "class:1")
        >>> y = TokenAttribution(10 * x.scores, tokens, "y", "class:1")   # y = 10 x
        >>> scores = agreement(x, y, keep=[False, True, True, True])     # [CLS] left out
        >>> scores["kendall_tau"][0], scores["topk_overlap"], round(scores["jsd"][0], 12)
        (1.0, (1.0, None), 0.0)
    """
    for item in (x, y):
        if not isinstance(item, TokenAttribution):
            raise InputError(f"agreement takes TokenAttribution objects; got "
                             f"{type(item).__name__}")
    if x.tokens != y.tokens:
        raise InputError(f"{x.method} and {y.method} are over different tokens "
                         f"({len(x.tokens)} vs {len(y.tokens)}); compare attributions of the "
                         "same tokenised text")
    a, b = x.scores.numpy(), y.scores.numpy()
    if keep is not None:
        mask = _mask(keep, len(x.tokens))
        a, b = a[mask], b[mask]
    n = a.size
    if n < 2:
        raise InputError(f"fewer than two tokens to compare ({n}) for {x.method} vs "
                         f"{y.method}")
    k = max(1, round(0.2 * n)) if k is None else min(k, n)
    names = (x.method, y.method)
    return {
        "kendall_tau": kendall_tau(a, b, names=names),
        "spearman": spearman(a, b, names=names),
        "topk_overlap": (topk_overlap(a, b, k, names=names), None),
        "jsd": (jsd(a, b, names=names), None),
    }


def truth_scores(importance: Any, truth: Any) -> dict[str, float]:
    """How well importance finds the tokens known to matter.

    Args:
        importance: ``[token]`` scores (magnitudes are used).
        truth: ``[token]`` bool, ``True`` on the decisive tokens; at least one of each.

    Returns:
        ``precision_at_k``: share of the ``k = #true`` tokens with the largest ``|importance|``
        that are true (ties broken by position);
        ``mass_on_truth``: share of ``Σ|importance|`` on true tokens;
        ``auroc``: probability that a true token outranks another token by ``|importance|``
        (rank formula, ties averaged: 1 = perfect, 0.5 = chance, 0 = reversed).

    Example:
        >>> found = truth_scores([0.9, 0.1, 0.6, 0.2], [True, False, True, False])
        >>> found["precision_at_k"], found["auroc"]     # both true tokens rank first
        (1.0, 1.0)
        >>> round(found["mass_on_truth"], 4)            # (0.9 + 0.6) / 1.8
        0.8333
    """
    from scipy.stats import rankdata

    scores = np.abs(_vector(importance, "importance"))
    mask = _mask(truth, scores.size)
    n_true = int(mask.sum())
    n_false = scores.size - n_true
    if n_true == 0 or n_false == 0:
        raise InputError(f"truth needs at least one true and one false token; got {n_true} true "
                         f"of {scores.size}")
    top = _top(scores, n_true)
    precision = sum(bool(mask[i]) for i in top) / n_true
    mass = float(_distribution(scores, "importance")[mask].sum())
    ranks = rankdata(scores)  # average ranks for ties
    auroc = (ranks[mask].sum() - n_true * (n_true + 1) / 2) / (n_true * n_false)
    return {"precision_at_k": float(precision), "mass_on_truth": mass, "auroc": float(auroc)}
