"""Percentile-bootstrap confidence intervals of a mean over examples, for many patches at once
(:func:`attnprobe.patch.summary` with ``ci=``).

The protocol, exactly (so an interval can be recomputed by hand):

1. ``rng = numpy.random.default_rng(seed)``; ``draws = rng.integers(0, n, size=(n_boot, n))``
   over the ``n`` examples (in the order they first appear in the table). One set of draws
   serves every patch, so all patches are resampled with the same examples (their intervals
   are comparable, and they do not depend on the order of the patches).
2. Draw ``b``'s mean of a patch is the mean of its effects over ``draws[b]`` (an example drawn
   twice counts twice), leaving out examples without an effect (NaN, or no row for that
   patch); a draw with none of them has no mean and is left out.
3. ``ci_low, ci_high = numpy.nanquantile(means, [(1 − ci) / 2, (1 + ci) / 2])`` (numpy's
   default linear interpolation).

A patch with fewer than two examples with an effect gets a NaN interval: one value gives no
interval. Effects that are all equal give a zero-width interval at that value (a draw's mean
is computed as the patch's first value plus the mean deviation from it, exactly 0 then).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.core.checks import check_number
from attnprobe.errors import InputError

__all__ = ["Intervals", "bootstrap_means", "check_ci"]


@dataclass(frozen=True)
class Intervals:
    """``low`` / ``high`` ``[patch]`` (NaN for patches with fewer than two values) and
    ``few``, how many patches those are."""

    low: np.ndarray
    high: np.ndarray
    few: int


def check_ci(ci: float, n_boot: int, seed: int) -> None:
    """One-line InputErrors for a level outside (0, 1), fewer than one draw, a bad seed."""
    check_number("ci", ci, integer=False, minimum=0, strict=True)
    if ci >= 1:
        raise InputError(f"ci is a confidence level between 0 and 1 (e.g. 0.95); got {ci!r}")
    check_number("n_boot", n_boot, integer=True, minimum=1)
    check_number("seed", seed, integer=True, minimum=0)


def bootstrap_means(values: np.ndarray, *, ci: float, n_boot: int, seed: int) -> Intervals:
    """The ``ci`` interval of each row's mean (module docstring).

    Args:
        values: ``[patch, example]`` effects, NaN where a patch has none for an example.
        ci / n_boot / seed: the level, the number of draws and the generator's seed.
    """
    check_ci(ci, n_boot, seed)
    values = np.asarray(values, dtype=float)
    n_patches, n = values.shape
    have = ~np.isnan(values)  # [patch, example]
    enough = have.sum(axis=1) >= 2
    low = np.full(n_patches, np.nan)
    high = np.full(n_patches, np.nan)
    if n == 0 or not enough.any():
        return Intervals(low, high, int((~enough).sum()))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_boot, n))
    counts = np.zeros((n_boot, n))  # [draw, example]: how often each example was drawn
    np.add.at(counts, (np.arange(n_boot)[:, None], draws), 1.0)
    kept = values[enough]
    # each patch's first value: equal values deviate from it by exactly 0
    point = kept[np.arange(len(kept)), have[enough].argmax(axis=1)]  # [patch]
    deviation = np.where(have[enough], kept - point[:, None], 0.0)
    totals = counts @ deviation.T  # [draw, patch]
    weights = counts @ have[enough].T.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = point[None] + totals / weights  # NaN: a draw without the patch's examples
    alpha = (1 - ci) / 2
    low[enough], high[enough] = np.nanquantile(means, [alpha, 1 - alpha], axis=0)
    return Intervals(low, high, int((~enough).sum()))
