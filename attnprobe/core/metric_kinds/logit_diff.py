"""``logit_diff:A,B``: ``logit(A) - logit(B)``, the metric Heimersheim & Nanda recommend for
patching (probabilities saturate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnprobe.core.metric_base import Metric
from attnprobe.core.metric_build import difference, one_token, repeated
from attnprobe.core.metric_kind import MetricKind, metric_kind
from attnprobe.core.metric_reading import TokenRead
from attnprobe.core.metric_tokens import resolve_token
from attnprobe.core.positions import Positions
from attnprobe.errors import InputError

RANK = 20


def build(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    """``logit_diff:A,B`` with one pair for every example."""
    names = argument.split(",")
    written = f"logit_diff:{argument.strip()}"
    if len(names) != 2 or not all(name.strip() for name in names):
        raise InputError(f"metric {written} needs two tokens, e.g. 'logit_diff:Paris,Rome'")
    found = tuple(one_token(name, tokenizer, written) for name in names)
    spec = "logit_diff:" + ",".join(f.shown for f in found)
    correct = TokenRead(spec, repeated(found[0], n), positions, "logit")
    wrong = TokenRead(spec, repeated(found[1], n), positions, "logit")
    return difference(spec, correct, wrong, found)


def build_pairs(pairs: Sequence[tuple[Any, Any]], tokenizer: Any, positions: Positions
                ) -> Metric:
    """``logit_diff`` with one ``(correct, wrong)`` pair per example (``[batch]`` ids)."""
    correct = [resolve_token(a, tokenizer, "logit_diff") for a, _ in pairs]
    wrong = [resolve_token(b, tokenizer, "logit_diff") for _, b in pairs]
    name = f"logit_diff:{len(pairs)} pairs"
    return difference(name, TokenRead(name, torch.tensor([t.id for t in correct]), positions,
                                      "logit"),
                      TokenRead(name, torch.tensor([t.id for t in wrong]), positions, "logit"),
                      (*correct, *wrong))


metric_kind(MetricKind(
    "logit_diff", build, forms=("logit_diff:A,B",),
    help="logit(A) - logit(B) (Heimersheim & Nanda's recommended patching metric)",
    example="logit_diff:t05,t11", rank=RANK, pairs=build_pairs))
