"""What metric kinds are built from: a spec's token resolved, a token read repeated over a
batch, a read of the input's own next token held on a reference batch, a difference of two
reads. Public so that a kind module (:mod:`attnprobe.core.metric_kinds`) needs nothing
private.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnprobe.core.metric_base import Metric, MetricFn
from attnprobe.core.metric_reading import LogitTerms, TokenRead, join_terms, sized_read
from attnprobe.core.metric_tokens import Resolved, resolve_token
from attnprobe.core.positions import Batch, Positions
from attnprobe.errors import InputError

__all__ = ["broadcast", "broadcast_terms", "difference", "held_reading", "one_token",
           "reading", "repeated"]


def one_token(token: str, tokenizer: Any, spec: str) -> Resolved:
    """The one token a kind reads (:mod:`attnprobe.core.metric_tokens`); an empty name is
    an error showing the kind's form."""
    if not token.strip():
        raise InputError(f"metric {spec} needs a token, e.g. '{spec.split(':')[0]}:Paris'")
    return resolve_token(token, tokenizer, spec)


def repeated(found: Resolved, n: int | None) -> torch.Tensor:
    """``[n or 1]``: the token's id once per example."""
    return torch.full((n or 1,), found.id, dtype=torch.long)


def broadcast(read: TokenRead) -> MetricFn:
    """``read`` with its one token repeated over however many examples a batch has."""

    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return sized_read(read, batch)(output, batch)

    return fn


def broadcast_terms(read: TokenRead, sign: float = 1.0) -> Callable[[Batch], LogitTerms]:
    """The logit terms of ``read`` (times ``sign``) over however many examples a batch has."""
    def terms(batch: Batch) -> LogitTerms:
        return sized_read(read, batch).terms(batch, sign)

    return terms


def held_reading(read: TokenRead, anchor: bool = True) -> Metric:
    """A metric of the input's own next token; fixed on a reference batch, that batch's."""
    def held(batch: Batch) -> Metric:
        return held_reading(read.held(batch), anchor=False)

    return Metric(read.spec, read, read.terms if read.how == "logit" else None,
                  anchor=held if anchor else None)


def reading(how: str) -> Callable[[str, Any, Positions, int | None], Metric]:
    """The builder of a kind reading one token's ``how`` (``logit``, ``prob``,
    ``logprob``): ``how:T`` a named token, ``how:next`` the input's next token."""
    def build(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
        if argument.strip() == "next":
            return held_reading(TokenRead(f"{how}:next", None, positions, how))
        found = one_token(argument, tokenizer, f"{how}:{argument.strip()}")
        spec = f"{how}:{found.shown}"
        read = TokenRead(spec, repeated(found, n), positions, how)
        return Metric(spec, broadcast(read),
                      broadcast_terms(read) if how == "logit" else None, tokens=(found,))

    return build


def difference(spec: str, correct: TokenRead, wrong: TokenRead,
               tokens: tuple[Resolved, ...]) -> Metric:
    """``correct - wrong``, linear in the logits."""
    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return sized_read(correct, batch)(output, batch) - sized_read(wrong, batch)(output, batch)

    def terms(batch: Batch) -> LogitTerms:
        return join_terms(sized_read(correct, batch).terms(batch),
                          sized_read(wrong, batch).terms(batch, -1))

    return Metric(spec, fn, terms, tokens=tokens)
