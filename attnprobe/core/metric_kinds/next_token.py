"""``next-token``: the logit of the model's own top next token, chosen once on a reference
run (``next-token:T`` names the token)."""

from __future__ import annotations

from typing import Any

import torch

from attnprobe.core.metric_base import Metric
from attnprobe.core.metric_build import reading
from attnprobe.core.metric_kind import MetricKind, metric_kind
from attnprobe.core.metric_reading import TokenRead, logits_of
from attnprobe.core.positions import Batch, Positions, positions_mask
from attnprobe.errors import InputError

RANK = 40


def build(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    """``next-token`` (fixed on the reference run) or ``next-token:T`` (token T's logit)."""
    if argument.strip():
        fixed = reading("logit")(argument, tokenizer, positions, n)
        if fixed.anchor is not None:
            raise InputError("next-token:T names one token; for the input's own next token "
                             "give logit:next")
        return Metric("next-token:" + fixed.spec.partition(":")[2], fixed.fn, fixed.terms,
                      tokens=fixed.tokens)

    def choose(output: Any, batch: Batch) -> Metric:
        logits = logits_of(output, "next-token")
        mask = positions_mask(positions, batch)
        if (mask.sum(-1) != 1).any():
            raise InputError("next-token reads one position per example (positions='last' or "
                             "one position each)")
        slot = mask.long().argmax(-1)
        top = logits[torch.arange(logits.shape[0]), slot].argmax(-1)  # [batch]
        spec = "next-token:" + ",".join(str(int(t)) for t in top.unique())
        read = TokenRead(spec, top.detach().cpu(), positions, "logit")
        return Metric(spec, read, read.terms)

    return Metric("next-token", choose=choose)


metric_kind(MetricKind(
    "next-token", build, forms=("next-token", "next-token:T"),
    help="the logit of the model's own top next token at the last real position, chosen "
         "once on the reference (clean) run; next-token:T the logit of token T",
    example="next-token", rank=RANK))
