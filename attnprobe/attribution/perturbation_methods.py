"""Perturbation attributions: ``leave_one_out`` (delete each token) and ``occlusion`` (replace
each token by [UNK]), registered in :data:`~attnprobe.attribution.method_base.METHODS`.

Special tokens are never deleted or replaced (score 0); the perturbed copies of a text run
batched, ``batch_size`` rows per forward. See :mod:`attnprobe.attribution.methods` for the
table of every method.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from attnprobe.attribution.method_base import METHODS, Explanation, Problem
from attnprobe.core.checks import check_positive_ints
from attnprobe.errors import InputError

__all__ = ["LeaveOneOut", "Occlusion"]


def _editable(problem: Problem, method: str) -> list[int]:
    positions = (~problem.special).nonzero().flatten().tolist()
    if not positions:
        raise InputError(f"{method}: the text has only special tokens")
    return positions


@dataclass(frozen=True)
class _Batched:
    """What both methods share: no knob, and ``batch_size`` perturbed copies per forward."""

    name: ClassVar[str]
    knob: ClassVar[str | None] = None
    batch_size: int = 8

    def __post_init__(self) -> None:
        check_positive_ints(self.name, batch_size=self.batch_size)


@METHODS.register("leave_one_out")
@dataclass(frozen=True)
class LeaveOneOut(_Batched):
    """``f(x) − f(x without token i)``, all deletions of a text batched.

    Args:
        batch_size: perturbed copies per forward.
    """

    name: ClassVar[str] = "leave_one_out"

    def cost(self, n_tokens: int) -> int:
        return n_tokens * (n_tokens - 1)

    def explain(self, problem: Problem) -> Explanation:
        positions = _editable(problem, self.name)
        ids = problem.ids[0]
        n = len(ids)
        if n < 2:
            raise InputError(f"{self.name}: a one-token text leaves nothing to run")
        keep = torch.ones(len(positions), n, dtype=torch.bool, device=ids.device)
        keep[torch.arange(len(positions)), positions] = False
        variants = ids.expand(len(positions), -1)[keep].view(len(positions), n - 1)
        return _output_drops(problem, self.batch_size, positions, variants)


@METHODS.register("occlusion")
@dataclass(frozen=True)
class Occlusion(_Batched):
    """``f(x) − f(x with token i replaced by [UNK])`` (pad when there is no unk), batched.

    Args:
        batch_size: perturbed copies per forward.
    """

    name: ClassVar[str] = "occlusion"

    def cost(self, n_tokens: int) -> int:
        return n_tokens * n_tokens

    def explain(self, problem: Problem) -> Explanation:
        positions = _editable(problem, self.name)
        fill = problem.unk_id if problem.unk_id is not None else problem.pad_id
        if fill is None:
            raise InputError("occlusion: the tokenizer has neither an unk nor a pad token")
        ids = problem.ids[0]
        variants = ids.repeat(len(positions), 1)  # [k, seq]
        variants[torch.arange(len(positions)), positions] = fill
        return _output_drops(problem, self.batch_size, positions, variants)


def _output_drops(problem: Problem, batch_size: int, positions: list[int],
                  variants: torch.Tensor) -> Explanation:
    """``f(x) − f(variant)`` at each edited position (``variants[j]`` edits ``positions[j]``),
    0 elsewhere; the variants run ``batch_size`` rows per forward."""
    values = replace(problem, batch_size=batch_size).evaluate(variants)
    scores = torch.zeros(problem.ids.shape[1], dtype=values.dtype, device=values.device)
    scores[positions] = problem.value - values
    return Explanation(scores)
