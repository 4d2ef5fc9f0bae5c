"""Clean and corrupted inputs, and the metric read on their runs.

Patching needs two inputs per example of **equal token length** — the clean ``x`` and the
corrupted ``x̃`` (Heimersheim & Nanda 2024) — so that an activation of one run fits the
other position by position: :func:`prepare_pairs` checks that before any forward (a one-line
error naming the first pair that differs) and applies ``truncation`` to both alike. Inputs are
strings or token ids, as in every corpus analysis (:mod:`attnprobe.inputs.text`).

The metric (:mod:`attnprobe.core.metric`) is built per batch of examples
(:class:`MetricPlan`): per-example ``positions`` (a list per example, or a bool mask
``[example, seq]``) and ``logit_diff`` ``pairs`` are taken for the batch's examples, and
``next-token`` is fixed on the clean run of the batch (its top token), so the same tokens are
read in every run. A batch of patched rows repeats the examples once per patch; the metric
reads each repetition as its own batch (:func:`rows_of`), so callables see exactly the
``(output, batch)`` of the examples they were written for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.core.metric import Metric, Positions, parse_metric
from attnprobe.errors import InputError
from attnprobe.inputs.text import (
    Text,
    Truncation,
    encode,
    model_inputs,
    prepare_corpus,
    token_lengths,
    token_limit,
    truncation_mode,
)
from attnprobe.inputs.token_ids import check_inputs

__all__ = ["DIRECTIONS", "MetricPlan", "Pairs", "prepare_pairs", "rows_of"]

DIRECTIONS = ("denoising", "noising")
Pair = tuple[str | int, str | int]


@dataclass(frozen=True)
class Pairs:
    """The examples a patching run covers: ``clean[i]`` / ``corrupt[i]`` of ``lengths[i]``
    tokens (after cutting), at position ``index[i]`` of the caller's lists (``example_id``
    ``str(index[i])``)."""

    clean: tuple[Text, ...]
    corrupt: tuple[Text, ...]
    index: tuple[int, ...]
    lengths: tuple[int, ...]
    truncation: str
    max_length: int | None
    n_inputs: int  # how many pairs the caller gave (per-example metric options index them)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(str(i) for i in self.index)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def input_lengths(self) -> list[int | None]:
        """Tokens of each of the caller's ``n_inputs`` pairs as run (None: left out)."""
        lengths: list[int | None] = [None] * self.n_inputs
        for i, length in zip(self.index, self.lengths, strict=True):
            lengths[i] = length
        return lengths

    def encoded(self, model: nn.Module, tokenizer: Any, span: slice
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Model inputs ``[batch, seq]`` of the clean and corrupted examples of ``span``
        (the same padding: every pair has one length)."""
        mode = "cut" if self.truncation == "cut" else "error"
        clean = encode(model, tokenizer, self.clean[span], max_length=self.max_length,
                       truncation=mode)
        corrupt = encode(model, tokenizer, self.corrupt[span], max_length=self.max_length,
                         truncation=mode)
        if not torch.equal(clean["attention_mask"], corrupt["attention_mask"]):
            raise InputError("clean and corrupt inputs pad differently; give pairs of equal "
                             "token length")
        return model_inputs(model, clean), model_inputs(model, corrupt)


def prepare_pairs(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, *,
                  truncation: Truncation = "error", max_length: int | None = None) -> Pairs:
    """Check clean and corrupted inputs before any forward (module docstring).

    Raises:
        InputError: different numbers of inputs, a pair of different token lengths (the
            first one is named), or what :func:`~attnprobe.inputs.text.prepare_corpus`
            refuses (empty texts, unknown ids, too long under ``truncation="error"``).
    """
    clean_items, corrupt_items = check_inputs(clean), check_inputs(corrupt)
    if len(clean_items) != len(corrupt_items):
        raise InputError(f"{len(clean_items)} clean and {len(corrupt_items)} corrupted inputs; "
                         "give one corrupted input per clean one")
    clean_lengths = token_lengths(tokenizer, clean_items, model=model)
    corrupt_lengths = token_lengths(tokenizer, corrupt_items, model=model)
    for i, (a, b) in enumerate(zip(clean_lengths, corrupt_lengths, strict=True)):
        if a != b:
            raise InputError(f"clean and corrupted input {i} tokenize to {a} and {b} tokens; "
                             "patching moves activations position by position, so each pair "
                             "must have one length (swap words for words of as many tokens)")
    mode = truncation_mode(truncation)
    kept = prepare_corpus(model, tokenizer, clean_items, truncation=mode, max_length=max_length)
    index = tuple(int(i) for i in kept.ids)
    limit = token_limit(model, tokenizer, max_length) if mode == "cut" else None
    lengths = tuple(min(clean_lengths[i], limit) if limit else clean_lengths[i] for i in index)
    return Pairs(tuple(clean_items[i] for i in index), tuple(corrupt_items[i] for i in index),
                 index, lengths, mode, max_length, len(clean_items))


# ----------------------------------------------------------------------------- metric
def _positions_for(positions: Positions, index: Sequence[int], width: int, n: int
                   ) -> Positions:
    """``positions`` for the examples ``index`` (of the caller's ``n``) padded to ``width``."""
    if isinstance(positions, torch.Tensor) and positions.dtype == torch.bool:
        if positions.ndim != 2 or positions.shape[0] != n:
            raise InputError(f"a positions mask must be [example, seq] with one row per "
                             f"example ({n}); got {list(positions.shape)}")
        rows = positions[list(index)]
        if rows.shape[1] < width:
            rows = torch.nn.functional.pad(rows, (0, width - rows.shape[1]))
        return rows[:, :width]
    if positions is None or isinstance(positions, (str, torch.Tensor)):
        return positions
    items = list(positions)
    if items and all(isinstance(p, (list, tuple)) for p in items):
        if len(items) != n:
            raise InputError(f"metric_positions gives {len(items)} lists for {n} examples")
        return [list(items[i]) for i in index]
    return items


@dataclass(frozen=True)
class MetricPlan:
    """The metric as the caller gave it, built for each batch of examples (module docstring).

    ``positions`` and ``pairs`` are per example of the caller's ``n`` inputs."""

    spec: Any
    tokenizer: Any
    positions: Positions
    pairs: Sequence[Pair] | None
    n: int

    def __post_init__(self) -> None:
        default = self.positions is None or (isinstance(self.positions, str)
                                             and self.positions == "last")
        if not isinstance(self.spec, str) and (not default or self.pairs is not None):
            raise InputError("metric_positions and pairs go with a metric spec string; a "
                             "Metric or a callable chooses its positions itself")
        if self.pairs is not None and len(self.pairs) != self.n:
            raise InputError(f"pairs gives {len(self.pairs)} (correct, wrong) pairs for "
                             f"{self.n} examples")
        self.build(range(min(self.n, 1)), 1, check_only=True)

    @property
    def name(self) -> str:
        """The metric as written into the table: its tokens resolved, and a metric of the
        input's next token read at the clean run's (``logit:next(clean)``)."""
        if isinstance(self.spec, str):
            return self.build(range(min(self.n, 1)), 1, check_only=True).named_for("clean")
        return parse_metric(self.spec).spec

    @property
    def token_ids(self) -> dict[str, int]:
        """The ids of the tokens the spec names (``{"ĠParis": 6342, ...}``)."""
        if isinstance(self.spec, str):
            return self.build(range(min(self.n, 1)), 1, check_only=True).token_ids
        return {}

    def build(self, index: Sequence[int], width: int, *, check_only: bool = False) -> Metric:
        """The metric for the examples ``index`` (caller positions) padded to ``width``."""
        if not isinstance(self.spec, str):
            return parse_metric(self.spec)
        positions = self.positions if check_only else _positions_for(
            self.positions, index, width, self.n)
        pairs = None if self.pairs is None else [self.pairs[i] for i in index]
        return parse_metric(self.spec, self.tokenizer, positions=positions, pairs=pairs)

    def values(self, metric: Metric, output: Any, batch: Mapping[str, torch.Tensor]
               ) -> torch.Tensor:
        """The metric of each example ``[batch]`` as float64 on the CPU, checked finite."""
        value = metric(output, batch).detach().double().cpu()
        if not torch.isfinite(value).all():
            raise InputError(f"metric {metric.spec!r} is NaN or inf for example "
                             f"{int((~torch.isfinite(value)).nonzero()[0])} of a batch")
        return value


def rows_of(output: Any, rows: slice, n: int) -> Any:
    """The rows ``rows`` of a forward's output of ``n`` rows: every tensor whose first axis
    has ``n`` entries is cut (logits, hidden states, a ModelOutput's fields, tuples of them);
    anything else (a KV cache) is passed as it is."""
    if isinstance(output, torch.Tensor):
        return output[rows] if output.ndim and output.shape[0] == n else output
    if isinstance(output, Mapping):
        cut = {k: rows_of(v, rows, n) for k, v in output.items()}
        try:
            return type(output)(**cut)
        except TypeError:
            return cut
    if isinstance(output, tuple):
        return tuple(rows_of(v, rows, n) for v in output)
    return output


def check_direction(direction: Any) -> str:
    if direction not in DIRECTIONS:
        raise InputError(f"unknown direction {direction!r}; choose 'denoising' (run the "
                         "corrupted input with clean activations: what is sufficient) or "
                         "'noising' (the clean input with corrupted ones: what is necessary)")
    return direction

