"""What a direct logit attribution measures, checked before any forward: the metric, where it
reads (``metric_positions``) and per-example ``logit_diff`` ``pairs`` — the names and
meanings the patching experiments use (:func:`attnprobe.patch.run`), so one request reads the
same in the whole causal lab.

``metric_positions`` and ``pairs`` are given per input of the caller's list (example ``i`` is
``texts[i]``); :class:`MetricRequest` cuts them to each batch. A ``Metric`` object or a
callable carries its own positions and tokens: giving either with one is an error, as in
patching.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.core.metric import Metric, Positions, parse_metric
from attnprobe.core.positions import fit_positions
from attnprobe.errors import InputError
from attnprobe.inputs.text import (
    Corpus,
    Truncation,
    token_lengths,
    token_limit,
    truncation_mode,
)

__all__ = ["DEFAULT_POSITIONS", "MetricRequest", "Pair", "metric_request",
           "renamed_positions"]

Pair = tuple[str | int, str | int]
DEFAULT_POSITIONS = "last"


def renamed_positions(metric_positions: Positions | None, positions: Positions | None
                      ) -> Positions | None:
    """``metric_positions``, or the deprecated ``positions=`` it replaced (a
    ``DeprecationWarning``; both given is an error)."""
    if positions is None:
        return metric_positions
    if not (isinstance(metric_positions, str) and metric_positions == DEFAULT_POSITIONS):
        raise InputError("give metric_positions= (positions= is its old name), not both")
    warnings.warn("logit_attribution(positions=...) is deprecated: use metric_positions=, as "
                  "the patching experiments do", DeprecationWarning, stacklevel=3)
    return positions


@dataclass(frozen=True)
class MetricRequest:
    """The metric as the caller gave it, per input of the caller's ``n`` (module docstring).

    Attributes:
        spec: a spec string (parsed per batch, with that batch's positions and pairs) or the
            parsed :class:`~attnprobe.core.metric.Metric`.
        parsed: the metric parsed once for the checks (over every position).
        positions: where a spec reads, checked against the inputs (``None``: the default).
        pairs: one ``(correct, wrong)`` pair per input for ``logit_diff``, or None.
        tokenizer: names the spec's tokens.
    """

    spec: str | Metric
    parsed: Metric
    positions: Positions | None
    pairs: tuple[Pair, ...] | None
    tokenizer: Any

    def for_batch(self, rows: Sequence[int], width: int) -> tuple[Metric, Positions | None]:
        """The metric of the inputs ``rows`` (caller indices) padded to ``width`` tokens, and
        their positions (None for a Metric object, which carries its own)."""
        if not isinstance(self.spec, str):
            return self.spec, None
        positions = self.positions
        if isinstance(positions, torch.Tensor):  # fits the inputs: columns past width are empty
            positions = positions[list(rows), :width]
        elif isinstance(positions, list) and positions \
                and all(isinstance(p, list) for p in positions):
            positions = [positions[r] for r in rows]
        pairs = None if self.pairs is None else [self.pairs[r] for r in rows]
        return parse_metric(self.spec, self.tokenizer, positions=positions,
                            pairs=pairs), positions


def metric_request(model: nn.Module, tokenizer: Any, corpus: Corpus, metric: Any,
                   metric_positions: Any, pairs: Sequence[Pair] | None, *,
                   truncation: Truncation, max_length: int | None) -> MetricRequest:
    """Check the metric, its positions and pairs against the corpus (module docstring).

    Raises:
        InputError: positions or pairs with a Metric object or a callable; pairs not one per
            input; positions of the wrong kind, or that do not fit the inputs (the example
            and position named); what :func:`~attnprobe.core.metric.parse_metric` refuses.
    """
    n = len(corpus.ids) + len(corpus.skipped)
    default = metric_positions is None or (isinstance(metric_positions, str)
                                           and metric_positions == DEFAULT_POSITIONS)
    if not isinstance(metric, str) and (not default or pairs is not None):
        raise InputError("metric_positions and pairs go with a metric spec string; a Metric "
                         "or a callable chooses its positions itself")
    if pairs is not None:
        pairs = tuple(pairs)
        if len(pairs) != n:
            raise InputError(f"pairs gives {len(pairs)} (correct, wrong) pairs for {n} "
                             "examples")
    positions = fit_positions(metric_positions, _lengths(model, tokenizer, corpus, n,
                                                         truncation, max_length)
                              if _needs_lengths(metric_positions) else [None] * n,
                              "metric_positions")
    parsed = parse_metric(metric, tokenizer, positions="all",
                          pairs=None if pairs is None else list(pairs))
    spec = metric if isinstance(metric, str) else parsed
    return MetricRequest(spec, parsed, positions, pairs, tokenizer)


def _needs_lengths(positions: Any) -> bool:
    return not (positions is None or isinstance(positions, str))


def _lengths(model: nn.Module, tokenizer: Any, corpus: Corpus, n: int,
             truncation: Truncation, max_length: int | None) -> list[int | None]:
    """Each caller input's token count as it will run (cut to the limit under ``cut``;
    None for an input left out)."""
    found = token_lengths(tokenizer, corpus.texts, model=model)
    limit = token_limit(model, tokenizer, max_length) \
        if truncation_mode(truncation) == "cut" else None
    lengths: list[int | None] = [None] * n
    for i, length in zip(corpus.ids, found, strict=True):
        lengths[int(i)] = min(length, limit) if limit else length
    return lengths
