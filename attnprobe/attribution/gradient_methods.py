"""The gradient attribution methods: Integrated Gradients, saliency, input × gradient and
GradientSHAP, each a registered :data:`~attnprobe.attribution.method_base.METHODS` entry
(the table of scores is in :mod:`attnprobe.attribution.methods`, which also holds the entry
point :func:`~attnprobe.attribution.methods.attribute`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from attnprobe.attribution.method_base import METHODS, Explanation, Problem
from attnprobe.core.checks import check_positive_ints
from attnprobe.core.optional import require

__all__ = ["PASS_TOKENS", "GradientShap", "InputXGradient", "IntegratedGradients", "Saliency"]

# Integrated Gradients with internal_batch_size=None puts this many tokens (steps x text
# length) through the model per forward: all 50 steps of a 160-token text in one pass.
PASS_TOKENS = 8192


# ---------------------------------------------------------------------------- gradients
@METHODS.register("integrated_gradients")
@dataclass(frozen=True)
class IntegratedGradients:
    """Captum ``LayerIntegratedGradients`` on the input embedding layer.

    Args:
        n_steps: points on the straight path from the baseline (Gauss-Legendre rule).
        internal_batch_size: path points per forward; None: as many as fit in
            :data:`PASS_TOKENS` tokens (all of them for short texts). Chunking does not
            change the scores.
    """

    name: ClassVar[str] = "integrated_gradients"
    summary: ClassVar[str] = ("Integrated Gradients on the input embeddings with its "
                                "convergence delta (all steps batched)")
    knob: ClassVar[str | None] = "n_steps"
    n_steps: int = 50
    internal_batch_size: int | None = None

    def __post_init__(self) -> None:
        check_positive_ints(self.name, n_steps=self.n_steps,
                            internal_batch_size=self.internal_batch_size)

    def cost(self, n_tokens: int) -> int:
        return (self.n_steps + 2) * n_tokens  # path points + input and baseline for delta

    def explain(self, problem: Problem) -> Explanation:
        captum = require("captum.attr")
        chunk = self.internal_batch_size or max(1, min(self.n_steps,
                                                       PASS_TOKENS // problem.n_tokens))
        ig = captum.LayerIntegratedGradients(problem.forward, problem.layer())
        attributions, delta = ig.attribute(
            problem.ids, baselines=problem.baseline_ids(),
            additional_forward_args=(problem.inputs["attention_mask"],),
            n_steps=self.n_steps, internal_batch_size=chunk, return_convergence_delta=True)
        return Explanation(attributions.sum(-1)[0], float(delta.abs().max()))


@dataclass(frozen=True)
class _LayerGradient:
    """∂target/∂(embedding output) for every token, one forward and backward."""

    name: ClassVar[str] = "_layer_gradient"
    knob: ClassVar[str | None] = None

    def cost(self, n_tokens: int) -> int:
        return n_tokens

    def _attributions(self, problem: Problem, *, multiply: bool) -> torch.Tensor:
        captum = require("captum.attr")
        method = captum.LayerGradientXActivation(problem.forward, problem.layer(),
                                                 multiply_by_inputs=multiply)
        out = method.attribute(problem.ids,
                               additional_forward_args=(problem.inputs["attention_mask"],))
        return out[0]  # [seq, d]


@METHODS.register("saliency")
@dataclass(frozen=True)
class Saliency(_LayerGradient):
    """``‖∂f/∂e_i‖₂`` over the embedding dimension."""

    name: ClassVar[str] = "saliency"
    summary: ClassVar[str] = "the gradient's norm per token"

    def explain(self, problem: Problem) -> Explanation:
        return Explanation(self._attributions(problem, multiply=False).norm(dim=-1))


@METHODS.register("input_x_gradient")
@dataclass(frozen=True)
class InputXGradient(_LayerGradient):
    """``Σ_d e_i · ∂f/∂e_i`` (gradient × embedding)."""

    name: ClassVar[str] = "input_x_gradient"
    summary: ClassVar[str] = "input × gradient, summed over the embedding"

    def explain(self, problem: Problem) -> Explanation:
        return Explanation(self._attributions(problem, multiply=True).sum(-1))


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch and numpy (Captum draws from both) and restore both afterwards."""
    state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state)


@METHODS.register("gradient_shap")
@dataclass(frozen=True)
class GradientShap:
    """Captum ``GradientShap`` on the embedding output (replaced through a hook).

    Args:
        n_samples: random (baseline, point on the path) draws, averaged.
        stdevs: Gaussian noise added to the input embedding of each draw.
        seed: seeds torch and numpy for the draws (the global states are restored).
    """

    name: ClassVar[str] = "gradient_shap"
    summary: ClassVar[str] = "GradientSHAP (Captum), seeded"
    knob: ClassVar[str | None] = "n_samples"
    n_samples: int = 20
    stdevs: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_ints(self.name, n_samples=self.n_samples)

    def cost(self, n_tokens: int) -> int:
        return (self.n_samples + 2) * n_tokens

    def explain(self, problem: Problem) -> Explanation:
        captum = require("captum.attr")
        embeds = problem.embedded(problem.ids)  # [1, seq, d]
        pad = problem.embedded(problem.baseline_ids())
        keep = problem.special.view(1, -1, 1)
        zeros = torch.where(keep, embeds, torch.zeros_like(embeds))
        baselines = torch.cat([pad, zeros])  # [2, seq, d]
        shap = captum.GradientShap(problem.forward_from_embeddings)
        with _seeded(self.seed):
            out = shap.attribute(embeds, baselines=baselines, n_samples=self.n_samples,
                                 stdevs=self.stdevs,
                                 additional_forward_args=(problem.inputs["attention_mask"],))
        return Explanation(out.sum(-1)[0])
