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
    """What both methods share: no knob, and the score ``f(x) − f(variant)`` where each variant
    edits one non-special position.

    Args:
        batch_size: perturbed copies per forward.
    """

    name: ClassVar[str]
    knob: ClassVar[str | None] = None
    removes: ClassVar[int] = 0  # tokens a variant has fewer than the text
    batch_size: int = 8

    def __post_init__(self) -> None:
        check_positive_ints(self.name, batch_size=self.batch_size)

    def cost(self, n_tokens: int) -> int:
        """Token-forwards: at most ``n`` variants of ``n − removes`` tokens each."""
        return n_tokens * (n_tokens - self.removes)

    def variants(self, problem: Problem, positions: list[int]) -> torch.Tensor:
        """``[len(positions), seq']``: row ``j`` is the input with ``positions[j]`` edited."""
        raise NotImplementedError

    def explain(self, problem: Problem) -> Explanation:
        """``f(x) − f(variant)`` at each edited position, 0 at special tokens; the variants
        run ``batch_size`` rows per forward."""
        positions = _editable(problem, self.name)
        variants = self.variants(problem, positions)
        values = replace(problem, batch_size=self.batch_size).evaluate(variants)
        scores = torch.zeros(problem.ids.shape[1], dtype=values.dtype, device=values.device)
        scores[positions] = problem.value - values
        return Explanation(scores)


@METHODS.register("leave_one_out")
@dataclass(frozen=True)
class LeaveOneOut(_Batched):
    """``f(x) − f(x without token i)``; the deletions run ``batch_size`` per forward."""

    name: ClassVar[str] = "leave_one_out"
    summary: ClassVar[str] = "the change of the target when a token is deleted (batched)"
    removes: ClassVar[int] = 1

    def variants(self, problem: Problem, positions: list[int]) -> torch.Tensor:
        ids = problem.ids[0]
        n = len(ids)
        if n < 2:
            raise InputError(f"{self.name}: a one-token text leaves nothing to run")
        keep = torch.ones(len(positions), n, dtype=torch.bool, device=ids.device)
        keep[torch.arange(len(positions)), positions] = False
        return ids.expand(len(positions), -1)[keep].view(len(positions), n - 1)


@METHODS.register("occlusion")
@dataclass(frozen=True)
class Occlusion(_Batched):
    """``f(x) − f(x with token i replaced by [UNK])`` (the baseline token when there is no
    unk, :mod:`attnprobe.attribution.baseline`); the replacements run ``batch_size`` per
    forward."""

    name: ClassVar[str] = "occlusion"
    summary: ClassVar[str] = ("the change of the target when a token is replaced by `[UNK]` "
                                "(or the baseline token; batched)")

    def variants(self, problem: Problem, positions: list[int]) -> torch.Tensor:
        fill = problem.unk_id if problem.unk_id is not None else problem.baseline_id()
        variants = problem.ids[0].repeat(len(positions), 1)  # [k, seq]
        variants[torch.arange(len(positions)), positions] = fill
        return variants
