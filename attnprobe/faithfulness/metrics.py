"""Faithfulness metrics of one importance vector, as pure functions of the model's outputs.

Every function here takes numbers the model already produced (the explained output ``f`` on
the full text and on perturbed copies) and returns the metric; running the model is the
caller's job (:mod:`attnprobe.faithfulness.removal` builds the perturbed inputs).

Definitions (``n`` real, i.e. non-special, tokens; ``r_k`` the ``k`` highest-ranked ones):

- **comprehensiveness** at ``k`` (DeYoung et al. 2020): ``f(x) − f(x \\ r_k)``; high = the
  top tokens were needed.
- **sufficiency** at ``k``: ``f(x) − f(r_k)`` (only ``r_k`` kept); low = the top tokens suffice.
- **AOPC** of either: the mean over the removal levels (ERASER's code; the paper's
  ``1/(|B|+1)`` form adds a ``k = 0`` term that is 0, see :func:`aopc`).
- **deletion / insertion curves** (Samek et al. 2017; Petsiuk et al. 2018): ``f`` after
  removing (deletion) or keeping only (insertion) the top ``k`` tokens, ``k = 0..n``, ranked
  most-relevant-first (MoRF) or least-relevant-first (LeRF); area by the trapezoid rule over
  the removed share ``k / n`` in ``[0, 1]``.
- **ABPC** (Chrysostomou & Aletras 2021): area(deletion LeRF) − area(deletion MoRF); high =
  removing the top tokens first hurts far more than removing the bottom ones first.
- **τ with leave-one-out** (ferret's ``taucorr_loo``): Kendall τ-b between the importance and
  ``f(x) − f(x \\ j)`` over the real tokens.
- **bootstrap CI**: percentile bootstrap of the mean over examples, seeded.

Nothing returns NaN silently: a NaN/inf or constant importance vector, too few real tokens
for a level or a NaN output raise :class:`~attnprobe.errors.InputError` with one line; the
caller records such a row as NaN with that line as its note.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from attnprobe.attribution.metrics import kendall_tau
from attnprobe.errors import InputError

__all__ = [
    "DEFAULT_LEVELS", "abpc", "aopc", "bootstrap_ci", "comprehensiveness", "curve_area",
    "curve_counts", "leave_one_out_scores", "loo_tau", "random_ranking", "ranking",
    "removal_counts", "sufficiency",
]

DEFAULT_LEVELS: tuple[float, ...] = (0.01, 0.05, 0.10, 0.20, 0.50)


def _array(x: Any, name: str) -> np.ndarray:
    """``x`` as a flat float64 array; NaN or inf raise."""
    arr = x.detach().to("cpu", torch.float64).numpy() if isinstance(x, torch.Tensor) \
        else np.asarray(x, dtype=np.float64)
    arr = arr.reshape(-1)
    if not np.isfinite(arr).all():
        raise InputError(f"{name} contains NaN or inf")
    return arr


def _mask(special: Any, size: int) -> np.ndarray:
    """The special-token mask ``[size]`` as bools (None = no special tokens)."""
    if special is None:
        return np.zeros(size, dtype=bool)
    arr = special.detach().cpu().numpy() if isinstance(special, torch.Tensor) \
        else np.asarray(special)
    arr = arr.reshape(-1).astype(bool)
    if arr.size != size:
        raise InputError(f"special mask has {arr.size} entries but the scores have {size}")
    return arr


def ranking(scores: Any, special: Any = None, *, magnitude: bool = False) -> np.ndarray:
    """Positions of the real tokens, most important first.

    Args:
        scores: ``[seq]`` importance per position (specials included; their values ignored).
        special: ``[seq]`` bools, True at special tokens (never ranked); None = none.
        magnitude: rank by ``|score|`` instead of the signed score (signed is the default:
            a token that pushes the output down is the last one to remove for
            comprehensiveness).

    Returns:
        ``[n]`` int positions, ``n`` = real tokens; ties go to the earlier position.

    Raises:
        InputError: NaN/inf scores, no real token, or a constant vector over the real tokens
            (it ranks nothing; use :func:`random_ranking` for the baseline).

    Example:
        >>> ranking([9.0, 0.2, 0.7, 0.1, 9.0], [1, 0, 0, 0, 1]).tolist()
        [2, 1, 3]
    """
    x = _array(scores, "importance")
    spec = _mask(special, x.size)
    real = np.flatnonzero(~spec)
    if real.size == 0:
        raise InputError("the text has only special tokens: nothing to rank")
    values = np.abs(x[real]) if magnitude else x[real]
    if real.size > 1 and np.all(values == values[0]):
        raise InputError(f"the importance is constant ({values[0]:.4g} on all {real.size} "
                         "real tokens): it ranks nothing")
    return real[np.argsort(-values, kind="stable")]


def random_ranking(special: Any, seed: int) -> np.ndarray:
    """A seeded random order of the real positions: the random-order baseline.

    Args:
        special: ``[seq]`` bools, True at special tokens.
        seed: the generator's seed (one per example keeps the baseline reproducible).

    Returns:
        ``[n]`` int positions in random order.

    Example:
        >>> sorted(random_ranking([1, 0, 0, 0, 1], seed=0).tolist())
        [1, 2, 3]
    """
    spec = _mask(special, len(special))
    real = np.flatnonzero(~spec)
    if real.size == 0:
        raise InputError("the text has only special tokens: nothing to rank")
    return np.random.default_rng(seed).permutation(real)


def removal_counts(n_real: int, levels: Sequence[float] = DEFAULT_LEVELS) -> list[int]:
    """Tokens removed at each level: ``max(1, round(level · n))`` (half up), at most ``n − 1``.

    Args:
        n_real: real tokens in the text.
        levels: shares of the real tokens in ``(0, 1)``.

    Raises:
        InputError: a level outside ``(0, 1)``, or fewer than 2 real tokens (every level
            would remove every real token).

    Example:
        >>> removal_counts(20)
        [1, 1, 2, 4, 10]
    """
    if isinstance(n_real, bool) or not isinstance(n_real, (int, np.integer)) or n_real < 2:
        raise InputError(f"a removal level needs at least 2 real tokens (one removed, one "
                         f"kept); the text has {n_real}")
    if not levels:
        raise InputError("levels is empty")
    counts = []
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, (int, float)) \
                or not 0 < level < 1:
            raise InputError(f"a removal level must be a share in (0, 1); got {level!r}")
        counts.append(min(int(n_real) - 1, max(1, math.floor(level * n_real + 0.5))))
    return counts


def curve_counts(n_real: int, steps: int | None = None) -> np.ndarray:
    """The ``k`` of a deletion/insertion curve: ``0..n`` (``steps`` None), else ``steps + 1``
    evenly spaced counts from 0 to ``n`` (rounded half up, duplicates dropped).

    Example:
        >>> curve_counts(4).tolist()
        [0, 1, 2, 3, 4]
        >>> curve_counts(10, steps=4).tolist()
        [0, 3, 5, 8, 10]
    """
    if isinstance(n_real, bool) or not isinstance(n_real, (int, np.integer)) or n_real < 1:
        raise InputError(f"a curve needs at least 1 real token; the text has {n_real}")
    if steps is None:
        return np.arange(n_real + 1)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be a positive integer; got {steps!r}")
    return np.unique(np.floor(np.linspace(0, n_real, steps + 1) + 0.5).astype(int))


def _outputs(full: float, perturbed: Any) -> tuple[float, np.ndarray]:
    f0 = float(full)
    if not math.isfinite(f0):
        raise InputError(f"the explained output on the full text is {f0}")
    return f0, _array(perturbed, "the perturbed outputs")


def comprehensiveness(full: float, without_top: Any) -> np.ndarray:
    """``f(x) − f(x \\ r_k)`` per level.

    Args:
        full: ``f(x)``, the explained output on the full text.
        without_top: ``[levels]`` outputs with the top ``k`` tokens removed.

    Returns:
        ``[levels]`` float64.

    Example:
        >>> comprehensiveness(0.9, [0.5, 0.2]).round(6).tolist()
        [0.4, 0.7]
    """
    f0, out = _outputs(full, without_top)
    return f0 - out


def sufficiency(full: float, only_top: Any) -> np.ndarray:
    """``f(x) − f(r_k)`` per level, ``only_top`` = ``[levels]`` outputs with only the top
    ``k`` tokens kept. Returns ``[levels]`` float64.

    Example:
        >>> sufficiency(0.9, [0.6, 0.85]).round(6).tolist()
        [0.3, 0.05]
    """
    f0, out = _outputs(full, only_top)
    return f0 - out


def aopc(values: Any, *, include_zero: bool = False) -> float:
    """Area over the perturbation curve: the mean of per-level values.

    Args:
        values: ``[levels]`` comprehensiveness or sufficiency.
        include_zero: divide by ``levels + 1`` (ERASER's paper formula, whose ``k = 0``
            term is 0) instead of ``levels`` (ERASER's and ferret's code).

    Example:
        >>> aopc([0.2, 0.4, 0.6])
        0.4
        >>> aopc([0.2, 0.4, 0.6], include_zero=True)
        0.3
    """
    x = _array(values, "the per-level values")
    if x.size == 0:
        raise InputError("no removal level to average")
    return float(x.sum() / (x.size + 1 if include_zero else x.size))


def curve_area(values: Any, counts: Any, n_real: int) -> float:
    """Trapezoid area of a curve ``f`` against the removed share ``counts / n_real``.

    Args:
        values: ``[points]`` outputs at each count.
        counts: ``[points]`` increasing token counts from 0 to ``n_real``.
        n_real: real tokens (the share's denominator).

    Example:
        >>> curve_area([1.0, 0.5, 0.0], [0, 1, 2], 2)         # a straight line from 1 to 0
        0.5
    """
    y = _array(values, "the curve")
    k = _array(counts, "the curve's counts")
    if y.size != k.size or y.size < 2:
        raise InputError(f"a curve needs 2+ points with one count each; got {y.size} values "
                         f"and {k.size} counts")
    if np.any(np.diff(k) <= 0):
        raise InputError("the curve's counts must increase")
    x = k / float(n_real)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))


def abpc(morf: Any, lerf: Any, counts: Any, n_real: int) -> float:
    """Area between the deletion curves: ``area(LeRF) − area(MoRF)`` over the same counts.

    Args:
        morf: ``[points]`` outputs after deleting the top ``k`` (most relevant first).
        lerf: ``[points]`` outputs after deleting the bottom ``k`` (least relevant first).
        counts: ``[points]`` the ``k`` of both curves.
        n_real: real tokens.

    Example:
        >>> abpc([1.0, 0.2, 0.0], [1.0, 0.9, 0.0], [0, 1, 2], 2)   # LeRF above MoRF
        0.35
    """
    return curve_area(lerf, counts, n_real) - curve_area(morf, counts, n_real)


def leave_one_out_scores(full: float, without_each: Any) -> np.ndarray:
    """``f(x) − f(x \\ j)`` per real token ``j`` (``without_each`` = ``[n]`` outputs).

    Example:
        >>> leave_one_out_scores(0.9, [0.5, 0.8]).round(6).tolist()
        [0.4, 0.1]
    """
    f0, out = _outputs(full, without_each)
    return f0 - out


def loo_tau(scores: Any, loo: Any, special: Any = None) -> float:
    """Kendall τ-b between the importance and the leave-one-out scores over the real tokens.

    Args:
        scores: ``[seq]`` importance (specials included).
        loo: ``[n]`` leave-one-out scores of the real tokens in position order.
        special: ``[seq]`` bools, True at special tokens.

    Raises:
        InputError: fewer than 2 real tokens, or either vector constant over them.

    Example:
        >>> loo_tau([0.0, 3.0, 2.0, 1.0, 0.0], [0.3, 0.2, 0.1], [1, 0, 0, 0, 1])
        1.0
    """
    x = _array(scores, "importance")
    real = ~_mask(special, x.size)
    y = _array(loo, "leave-one-out scores")
    if y.size != int(real.sum()):
        raise InputError(f"{y.size} leave-one-out scores for {int(real.sum())} real tokens")
    return kendall_tau(x[real], y, names=("importance", "leave-one-out"))[0]


def bootstrap_ci(values: Any, *, n_boot: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float, float]:
    """The mean over examples and its percentile-bootstrap confidence interval.

    Args:
        values: ``[examples]`` one value per example (drop NaN rows first: they raise here).
        n_boot: resamples.
        level: the interval's coverage in ``(0, 1)``.
        seed: the generator's seed (the same seed gives the same interval).

    Returns:
        ``(mean, low, high)``; one example gives ``(v, v, v)``.

    Example:
        >>> mean, low, high = bootstrap_ci([0.1, 0.3, 0.2, 0.4], seed=0)
        >>> round(mean, 2), low <= mean <= high
        (0.25, True)
    """
    x = _array(values, "the per-example values")
    if x.size == 0:
        raise InputError("no example to average")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise InputError(f"n_boot must be a positive integer; got {n_boot!r}")
    if isinstance(level, bool) or not isinstance(level, float) or not 0 < level < 1:
        raise InputError(f"level must be a share in (0, 1); got {level!r}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(low), float(high)
