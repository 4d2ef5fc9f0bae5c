"""The :class:`Metric` object every metric kind builds: one number per example read off a
forward's output (``[batch]``), with what a patching run and a direct logit attribution need
to know about it (whether it is fixed on a reference run, its logit terms).

The vocabulary of specs is :mod:`attnprobe.core.metric`; each kind is one module of
:mod:`attnprobe.core.metric_kinds`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnprobe.core.checks import check_per_example
from attnprobe.core.metric_reading import LogitTerms
from attnprobe.core.metric_tokens import Resolved
from attnprobe.core.positions import Batch, batch_rows
from attnprobe.errors import InputError

__all__ = ["Metric", "MetricFn"]

MetricFn = Callable[[Any, Batch], torch.Tensor]


@dataclass(frozen=True, eq=False)
class Metric:
    """One number per example read off a forward's output.

    Args:
        spec: what is measured, as written into every result (``logit_diff:Paris,Rome``,
            ``next-token:464``, ``custom`` ...).
        fn: ``(output, batch) -> Tensor[batch]``; ``output`` is what the model returned (an
            HF ModelOutput, a tensor of logits or a tuple), ``batch`` holds ``input_ids`` and
            ``attention_mask`` ``[batch, seq]``.
        terms: for metrics linear in the logits, ``batch -> LogitTerms``.
        choose: for metrics fixed on a reference run first (``next-token``):
            ``(output, batch) -> Metric``.
        anchor: for metrics that read the input's own next token (``:next``, ``loss``):
            ``batch -> Metric`` reading that reference batch's next tokens in any run.
        tokens: the tokens the spec names, resolved (vocabulary string and id).
    """

    spec: str
    fn: MetricFn | None = field(default=None, repr=False)
    terms: Callable[[Batch], LogitTerms] | None = field(default=None, repr=False)
    choose: Callable[[Any, Batch], Metric] | None = field(default=None, repr=False)
    anchor: Callable[[Batch], Metric] | None = field(default=None, repr=False)
    tokens: tuple[Resolved, ...] = field(default=(), repr=False)

    @property
    def ready(self) -> bool:
        """False while the metric still has to be fixed on a reference run."""
        return self.choose is None

    @property
    def linear(self) -> bool:
        """Whether the metric is a sum of logits (:meth:`logit_terms`)."""
        return self.terms is not None or self.choose is not None

    @property
    def token_ids(self) -> dict[str, int]:
        """``{token as the spec shows it: id}`` of the tokens the spec names."""
        return {t.shown: t.id for t in self.tokens}

    def fixed(self, output: Any, batch: Batch) -> Metric:
        """The metric held fixed on this reference run: ``next-token`` picks its tokens, the
        metrics that read the input's next token read this batch's in every run after."""
        if self.anchor is not None:
            return self.anchor(batch)
        if self.choose is None:
            return self
        with torch.no_grad():
            return self.choose(output, batch)

    def named_for(self, reference: str) -> str:
        """The spec as a table of several runs fixed on the ``reference`` run writes it:
        ``logit:next(clean)`` for a metric that reads that run's next tokens."""
        return f"{self.spec}({reference})" if self.anchor is not None else self.spec

    def __call__(self, output: Any, batch: Batch) -> torch.Tensor:
        """The metric of each example, ``[batch]``."""
        if self.choose is not None or self.fn is None:
            raise InputError(f"metric {self.spec!r} is not fixed yet: call metric.fixed(output, "
                             "batch) on the reference run first")
        return check_per_example(self.fn(output, batch), what="metric", spec=self.spec,
                                 rows=batch_rows(batch), unit="number")

    def logit_terms(self, batch: Batch) -> LogitTerms:
        """The logits this metric sums on ``batch`` (linear metrics only)."""
        if self.terms is None:
            raise InputError(f"metric {self.spec!r} is not a sum of logits; a direct logit "
                             "attribution needs logit:T, logit_diff:A,B or a fixed next-token")
        return self.terms(batch)

    def __repr__(self) -> str:
        return f"Metric({self.spec!r})"

