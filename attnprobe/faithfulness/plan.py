"""The perturbed inputs one text needs, and the rows their outputs give.

For every source's ranking of a text, :func:`plan_text` lists the inputs of each test —
comprehensiveness and sufficiency at each removal level, the deletion curves
most-relevant-first (MoRF) and least-relevant-first (LeRF), the insertion curves in both
orders — and, once
per text, the unperturbed input and one input per left-out token (for τ with leave-one-out).
Every input goes into one shared :class:`InputPool`, which keeps one copy of identical
inputs (across sources, levels and texts), so each distinct input is run once; then
:func:`score_text` turns the pool's outputs into the tidy rows of
:class:`~attnprobe.faithfulness.result.Faithfulness`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnprobe.errors import InputError
from attnprobe.faithfulness.metrics import (
    aopc,
    comprehensiveness,
    curve_area,
    curve_counts,
    leave_one_out_scores,
    loo_tau,
    random_ranking,
    ranking,
    removal_counts,
    sufficiency,
)
from attnprobe.faithfulness.removal import Perturbed, Removal
from attnprobe.faithfulness.result import RANDOM_SOURCE

__all__ = ["AGGREGATES", "CURVES", "UNDEFINED", "Design", "InputPool", "SourcePlan", "TextPlan",
           "plan_text", "score_text"]

UNDEFINED = -1  # the pool index of an input the model cannot run (no token left to see)
CURVES = ("deletion_morf", "deletion_lerf", "insertion_morf", "insertion_lerf")
AGGREGATES = ("aopc_comprehensiveness", "aopc_sufficiency", "deletion_morf_area",
              "deletion_lerf_area", "insertion_morf_area", "insertion_lerf_area", "abpc",
              "tau_loo")


class InputPool:
    """Distinct perturbed inputs and who needs them: :meth:`add` returns the index of an
    input's one copy (equal ids, mask and target give the same index), or :data:`UNDEFINED`
    for an input that leaves the model no token to see (its output reads as NaN:
    :meth:`outputs_with_undefined`)."""

    def __init__(self) -> None:
        self.items: list[Perturbed] = []
        self.targets: list[int] = []  # index of each item's target in the caller's list
        self._seen: dict[tuple, int] = {}

    def add(self, ids: np.ndarray, drop: np.ndarray, removal: Removal, target: int) -> int:
        """The index of ``ids`` ``[seq]`` with the positions ``drop`` (bool ``[seq]``)
        removed by ``removal`` (the caller made sure ``drop`` holds real tokens only)."""
        if removal.kind == "delete":
            x, m = ids[~drop], np.ones(int((~drop).sum()), dtype=np.int64)
        elif removal.kind == "replace":
            x, m = np.where(drop, removal.fill_id, ids), np.ones(len(ids), dtype=np.int64)
        else:
            x, m = ids, (~drop).astype(np.int64)
        if not m.any():
            return UNDEFINED
        key = (target, x.tobytes(), m.tobytes())
        index = self._seen.get(key)
        if index is None:
            index = self._seen[key] = len(self.items)
            self.items.append(Perturbed(torch.from_numpy(np.array(x, dtype=np.int64)),
                                        torch.from_numpy(m)))
            self.targets.append(target)
        return index

    def outputs_with_undefined(self, outputs: np.ndarray) -> np.ndarray:
        """``outputs`` ``[len(pool)]`` with a NaN appended, read at :data:`UNDEFINED`."""
        return np.append(np.asarray(outputs, dtype=np.float64), np.nan)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class SourcePlan:
    """One source's tests on one text: pool indices per level and per curve point, or the
    note that says why it has none (a constant or NaN ranking)."""

    source: str
    kind: str
    scores: np.ndarray  # [seq] the importance, for τ with leave-one-out
    comp: list[int] = field(default_factory=list)
    suff: list[int] = field(default_factory=list)
    curves: dict[str, list[int]] = field(default_factory=dict)
    note: str = ""


@dataclass
class TextPlan:
    """One text's tests: the unperturbed input, the leave-one-out inputs and every source's."""

    example: str
    target: str
    n_real: int
    special: np.ndarray  # [seq] bool, positions never removed
    full: int
    counts: list[int]
    steps: list[tuple[float, int]]  # (nominal share, k) of each curve point
    loo: list[int]
    sources: list[SourcePlan]
    note: str = ""


def _curve_points(n_real: int, steps: int | None) -> list[tuple[float, int]]:
    """``(share, k)`` for each point: ``steps + 1`` evenly spaced shares (duplicate ``k``
    kept, so every text has the same shares), or every ``k`` when ``steps`` is None."""
    if steps is None:
        return [(int(k) / n_real, int(k)) for k in curve_counts(n_real)]
    return [(i / steps, math.floor(i * n_real / steps + 0.5)) for i in range(steps + 1)]


def _plan_source(plan: SourcePlan, order: np.ndarray, ids: np.ndarray, removal: Removal,
                 pool: InputPool, target: int, counts: Sequence[int],
                 steps: Sequence[tuple[float, int]]) -> None:
    """Pool indices of one ranking's tests: ``order`` ``[n]`` real positions, first = most
    important."""
    n = len(order)
    rank = np.full(len(ids), n)  # special positions rank past every real one: never removed
    rank[order] = np.arange(n)
    last = np.full(len(ids), n)
    last[order] = np.arange(n)[::-1]  # the least important first (LeRF)
    real = rank < n

    def add(k: int, by: np.ndarray, keep: bool) -> int:
        drop = (by >= k) & real if keep else by < k
        return pool.add(ids, drop, removal, target)

    plan.comp = [add(k, rank, False) for k in counts]
    plan.suff = [add(k, rank, True) for k in counts]
    plan.curves = {"deletion_morf": [add(k, rank, False) for _, k in steps],
                   "deletion_lerf": [add(k, last, False) for _, k in steps],
                   "insertion_morf": [add(k, rank, True) for _, k in steps],
                   "insertion_lerf": [add(k, last, True) for _, k in steps]}


@dataclass(frozen=True)
class Design:
    """How every text is tested: the removal procedure, the removal levels (shares of the
    real tokens) and the curves' steps (None: every count)."""

    removal: Removal
    levels: tuple[float, ...]
    curve_steps: int | None


def plan_text(example: str, ids: Any, special: np.ndarray,
              sources: Sequence[tuple[str, str, np.ndarray]], design: Design,
              pool: InputPool, target: int, *, target_spec: str, seed: int) -> TextPlan:
    """The tests of one text, their inputs added to ``pool``.

    Args:
        ids: ``[seq]`` the text's token ids.
        special: ``[seq]`` bool, the positions never removed (special tokens, and a causal
            model's explained last position).
        sources: ``(name, kind, scores [seq])`` of each explanation; the random-order
            baseline is added here (seeded by ``seed``).
        target: index of the text's fixed target (for the pool's identity of an input).
    """
    ids = np.asarray(ids, dtype=np.int64)
    nothing = np.zeros(len(ids), dtype=bool)
    removal = design.removal
    full = pool.add(ids, nothing, removal, target)
    n_real = int((~special).sum())
    try:
        counts = removal_counts(n_real, design.levels)
    except InputError as error:  # too short for a level: every source of the text is NaN
        return TextPlan(example, target_spec, n_real, special, full, [], [], [],
                        [SourcePlan(name, kind, scores) for name, kind, scores in sources],
                        note=str(error))
    steps = _curve_points(n_real, design.curve_steps)
    real = np.flatnonzero(~special)
    loo = []
    for j in real:
        drop = nothing.copy()
        drop[j] = True
        loo.append(pool.add(ids, drop, removal, target))
    plans = []
    for name, kind, scores in sources:
        plan = SourcePlan(name, kind, scores)
        try:
            order = ranking(scores, special)
        except InputError as error:  # constant / NaN: no ranking, recorded with the note
            plan.note = str(error)
        else:
            _plan_source(plan, order, ids, removal, pool, target, counts, steps)
        plans.append(plan)
    rnd = SourcePlan(RANDOM_SOURCE, RANDOM_SOURCE, np.zeros(len(ids)))
    _plan_source(rnd, random_ranking(special, seed), ids, removal, pool, target, counts, steps)
    plans.append(rnd)
    return TextPlan(example, target_spec, n_real, special, full, counts, steps, loo, plans)


UNDEFINED_NOTE = ("the explained output is NaN or inf on the text or a perturbed input (or a "
                  "removal left the model no token to see)")


def _undefined(outputs: np.ndarray, *indices: Sequence[int]) -> str:
    """:data:`UNDEFINED_NOTE` when an output at ``indices`` is not finite, else ""."""
    needed = [i for part in indices for i in part]
    return "" if np.isfinite(outputs[needed]).all() else UNDEFINED_NOTE


def _area(values: np.ndarray, ks: np.ndarray, n_real: int) -> float:
    """A curve's area over its distinct counts (a short text repeats a count)."""
    first = np.unique(ks, return_index=True)[1]
    return curve_area(values[first], ks[first], n_real)


def _level_rows(plan: TextPlan, source: SourcePlan, outputs: np.ndarray,
                levels: Sequence[float]) -> list[tuple]:
    """``(metric, level, k, value, note)`` of comprehensiveness, sufficiency and their AOPC."""
    note = plan.note or source.note or _undefined(outputs, [plan.full], source.comp,
                                                  source.suff)
    if note:
        return [*((m, level, None, math.nan, note) for m in ("comprehensiveness", "sufficiency")
                  for level in levels),
                ("aopc_comprehensiveness", math.nan, None, math.nan, note),
                ("aopc_sufficiency", math.nan, None, math.nan, note)]
    f0 = float(outputs[plan.full])
    comp = comprehensiveness(f0, outputs[source.comp])
    suff = sufficiency(f0, outputs[source.suff])
    rows = [(metric, level, k, value, "")
            for level, k, c, s in zip(levels, plan.counts, comp, suff, strict=True)
            for metric, value in (("comprehensiveness", c), ("sufficiency", s))]
    return [*rows, ("aopc_comprehensiveness", math.nan, None, aopc(comp), ""),
            ("aopc_sufficiency", math.nan, None, aopc(suff), "")]


def _curve_rows(plan: TextPlan, source: SourcePlan, outputs: np.ndarray) -> list[tuple]:
    """``(metric, level, k, value, note)`` of the curve areas and ABPC."""
    names = ("deletion_morf_area", "deletion_lerf_area", "insertion_morf_area",
             "insertion_lerf_area", "abpc")
    note = plan.note or source.note or _undefined(outputs, [plan.full],
                                                  *source.curves.values())
    if note:
        return [(name, math.nan, None, math.nan, note) for name in names]
    ks = np.array([k for _, k in plan.steps])
    areas = [_area(outputs[source.curves[c]], ks, plan.n_real) for c in CURVES]
    return [(name, math.nan, None, value, "")
            for name, value in zip(names, [*areas, areas[1] - areas[0]], strict=True)]


def score_text(plan: TextPlan, outputs: np.ndarray, levels: Sequence[float],
               removal: str) -> tuple[list[tuple], list[tuple]]:
    """The table rows (``TABLE_COLUMNS``) and curve rows (``CURVE_COLUMNS``) of one text,
    from ``outputs``, the explained output of every pooled input (NaN at
    :data:`UNDEFINED`). A metric whose ranking or outputs are undefined is a NaN row with a
    ``note``."""
    f0 = float(outputs[plan.full])
    rows: list[tuple] = []
    curve_rows: list[tuple] = []
    for source in plan.sources:
        tau, tau_note = _tau(source, f0, outputs[plan.loo], plan.special) \
            if not (plan.note or source.note) else (math.nan, plan.note or source.note)
        found = [*_level_rows(plan, source, outputs, levels),
                 *_curve_rows(plan, source, outputs), ("tau_loo", math.nan, None, tau, tau_note)]
        rows += [(plan.example, source.source, source.kind, metric, level, k, float(value),
                  removal, plan.target, note) for metric, level, k, value, note in found]
        for name, index in source.curves.items():
            for (share, k), i in zip(plan.steps, index, strict=True):
                curve_rows.append((plan.example, source.source, source.kind, name, share, k,
                                   float(outputs[i]), f0, removal))
    return rows, curve_rows


def _tau(source: SourcePlan, f0: float, without_each: np.ndarray,
         special: np.ndarray) -> tuple[float, str]:
    """Kendall τ of the source's importance with leave-one-out, or NaN and why not."""
    if source.kind == RANDOM_SOURCE:  # a random order has no scores to correlate
        return math.nan, "the random baseline has no importance scores"
    if not np.isfinite(without_each).all():
        return math.nan, "leave-one-out outputs are NaN or inf"
    try:
        return float(loo_tau(source.scores, leave_one_out_scores(f0, without_each),
                             special)), ""
    except InputError as error:
        return math.nan, str(error)
