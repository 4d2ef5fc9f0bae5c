"""What a perturbation experiment measures: the default distributional change, or one scalar
metric of the one metric vocabulary (:mod:`attnprobe.core.metric`).

``run(..., metric=...)``:

- ``"next-token"`` (the default): the change of the whole output as
  :mod:`attnprobe.perturb.readout` reads it — for a language model the next-token
  distribution at the last real token (``tvd``, ``jsd``, ``flip``, ``top_prob``), for a
  classifier the class distribution, for an embedding model the cosine / L2 distance.
- any other spec of :func:`~attnprobe.core.metric.parse_metric` (``logit:T``, ``prob:T``,
  ``logprob:T``, ``logit_diff:A,B``, ``loss``, ``logit:next`` ..., ``next-token:ID``), a
  ready :class:`~attnprobe.core.metric.Metric`, or a callable ``(output, batch) ->
  Tensor[batch]``: one number per example, read on the unperturbed run (``baseline``) and on
  the perturbed one (``perturbed``); the table's ``metric`` column holds the spec
  (``custom`` for a callable) and a ``positions`` column says where it was read.

``positions`` (scalar spec strings only): ``"last"`` (default; ``"all"`` for ``loss``),
``"all"``, one list of positions for every text, or one list per text of the caller's list
(indexed like ``example_id``, so batching and splitting over processes do not change it).
Positions count real tokens from 0; negative ones count from the end.

:class:`Scalar` reads the metric per batch; :func:`scalar_metric` builds it (``None`` for the
default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnprobe.core.metric import Metric, parse_metric
from attnprobe.errors import InputError

__all__ = ["DEFAULT_METRIC", "Scalar", "scalar_metric"]

DEFAULT_METRIC = "next-token"  # the distributional change of perturb/readout.py
_SHARED = ("last", "all")


def _is_default(metric: Any) -> bool:
    return isinstance(metric, str) and metric.strip().lower() == DEFAULT_METRIC


def _positions(positions: Any, n_texts: int) -> str | tuple[int, ...] | tuple[tuple[int, ...], ...]:
    """``positions`` as ``"last"`` / ``"all"``, one tuple for every text, or one per text."""
    if isinstance(positions, str):
        if positions not in _SHARED:
            raise InputError(f"unknown positions {positions!r}; choose 'last', 'all', a list "
                             "of positions, or one list per text")
        return positions
    if isinstance(positions, torch.Tensor):
        if positions.dtype == torch.bool:
            raise InputError("a positions mask belongs to one padded batch; perturb batches "
                             "the texts itself: give a list of positions, or one list per text")
        positions = positions.tolist()
    try:
        items = list(positions)
    except TypeError:
        raise InputError(f"positions must be 'last', 'all', a list of positions or one list "
                         f"per text; got {positions!r}") from None
    if not items:
        raise InputError("positions is empty; give at least one position")
    nested = [isinstance(p, (list, tuple)) for p in items]
    if any(nested) and not all(nested):
        raise InputError("positions mixes positions and lists; give one list of positions, or "
                         "one list per text")
    if all(nested):
        if len(items) != n_texts:
            raise InputError(f"positions gives {len(items)} lists for {n_texts} texts (one "
                             "list per text of the caller's list)")
        return tuple(tuple(_position(p) for p in part) for part in items)
    return tuple(_position(p) for p in items)


def _position(p: Any) -> int:
    if isinstance(p, bool) or not isinstance(p, int):
        raise InputError(f"positions must be integers; got {p!r}")
    return p


def _shown(positions: str | tuple) -> str:
    if isinstance(positions, str):
        return positions
    if positions and isinstance(positions[0], tuple):
        return "per text"
    return ",".join(map(str, positions))


@dataclass(frozen=True, eq=False)
class Scalar:
    """A scalar metric read on every forward of an experiment.

    ``metric`` is the :class:`~attnprobe.core.metric.Metric` for texts that share their
    positions; with one list of positions per text, ``source`` is re-parsed for the texts of
    each batch.
    """

    metric: Metric
    source: Any  # the spec string (re-parsed per batch for per-text positions)
    tokenizer: Any
    positions: str | tuple | None  # None: the metric carries its own (Metric, callable)

    @property
    def spec(self) -> str:
        return self.metric.spec

    @property
    def per_text(self) -> bool:
        return isinstance(self.positions, tuple) and bool(self.positions) \
            and isinstance(self.positions[0], tuple)

    def at(self, rows: Sequence[int] | None) -> Metric:
        """The metric for a batch whose row ``r`` is text ``rows[r]`` of the caller's list."""
        if not self.per_text:
            return self.metric
        if rows is None:
            raise InputError(f"metric {self.spec}: per-text positions need the texts of the "
                             "batch")
        lists = [list(self.positions[i]) for i in rows]  # type: ignore[index]
        return parse_metric(self.source, self.tokenizer, positions=lists)

    def read(self, output: Any, inputs: Mapping[str, torch.Tensor],
             rows: Sequence[int] | None) -> torch.Tensor:
        """The metric of each batch row, ``[batch]`` float64 on the CPU."""
        try:
            return self.at(rows)(output, inputs).detach().double().cpu()
        except InputError as exc:
            if rows is None or len(rows) < 2:
                raise
            # the vocabulary counts examples within the batch: say which texts they are
            texts = ", ".join(map(str, dict.fromkeys(rows)))
            raise InputError(f"{exc} (batch of texts {texts}; example k is the k-th row)"
                             ) from None

    def compare(self, before: torch.Tensor, after: torch.Tensor
                ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{spec: (baseline, perturbed)}``, each ``[batch]``."""
        return {self.spec: (before.expand_as(after), after)}

    def record(self) -> dict[str, Any]:
        """The ``positions`` column (where the metric was read)."""
        return {} if self.positions is None else {"positions": _shown(self.positions)}


def scalar_metric(metric: Any, tokenizer: Any, positions: Any, n_texts: int) -> Scalar | None:
    """The :class:`Scalar` ``metric`` names, or ``None`` for the default (module docstring).

    Raises:
        InputError: an unknown kind or token (:func:`~attnprobe.core.metric.parse_metric`),
            bad positions, positions with the default metric or with a metric that carries
            its own, or a metric that must first be fixed on a reference run.
    """
    if _is_default(metric):
        if positions is not None:
            raise InputError("positions changes nothing with the default metric 'next-token' "
                             "(the output's distributional change at the last token); give a "
                             "scalar metric such as 'logit:next' or 'loss', or leave it out")
        return None
    if isinstance(metric, Metric) or (callable(metric) and not isinstance(metric, str)):
        if positions is not None:
            raise InputError("positions changes nothing for a Metric object or a callable "
                             "metric (it reads its own positions); leave it out")
        parsed = parse_metric(metric)
        if not parsed.ready:
            raise InputError(f"metric {parsed.spec!r} still has to be fixed on a reference "
                             "run; perturb's default 'next-token' is the distributional "
                             "change; for one token's logit give 'next-token:ID' or 'logit:T'")
        return Scalar(parsed, metric, tokenizer, None)
    if not isinstance(metric, str):
        parse_metric(metric)  # the one-line message of the metric vocabulary
    kind = metric.strip().partition(":")[0].strip().lower()
    chosen = _positions("all" if kind == "loss" else "last", n_texts) if positions is None \
        else _positions(positions, n_texts)
    shared = chosen if not (isinstance(chosen, tuple) and chosen
                            and isinstance(chosen[0], tuple)) else chosen[0]
    parsed = parse_metric(metric, tokenizer,
                          positions=list(shared) if isinstance(shared, tuple) else shared)
    return Scalar(parsed, metric, tokenizer, chosen)
