"""``loss``: the next-token cross-entropy of the input's own next tokens."""

from __future__ import annotations

from typing import Any

import torch

from attnprobe.core.metric_base import Metric
from attnprobe.core.metric_kind import MetricKind, metric_kind
from attnprobe.core.metric_reading import TokenRead
from attnprobe.core.positions import Batch, Positions
from attnprobe.errors import InputError

RANK = 30


def build(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    """``loss`` (no argument); ``last`` positions mean every position with a real next
    token, the loss's own default."""
    if argument.strip():
        raise InputError("metric loss takes no argument (choose where with positions=...)")
    return loss_of(TokenRead("loss", None, "all" if positions == "last" else positions,
                             "logprob"))


def loss_of(read: TokenRead, anchor: bool = True) -> Metric:
    """Minus the log-probability of the input's next tokens (of a reference batch's once
    fixed on it)."""
    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return -read(output, batch)

    def held(batch: Batch) -> Metric:
        return loss_of(read.held(batch), anchor=False)

    return Metric("loss", fn, anchor=held if anchor else None)


metric_kind(MetricKind(
    "loss", build, forms=("loss",),
    help="the next-token cross-entropy of the input's own next tokens (default: every "
         "position)",
    example="loss", rank=RANK, reads_next=lambda argument: True))
