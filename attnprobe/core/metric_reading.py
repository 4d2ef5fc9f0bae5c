"""How a metric reads a forward's output: the language-model logits, one token per example
or the input's next token at chosen positions, and the sum of logits a linear metric is.

:class:`TokenRead` is the reading every token kind of :mod:`attnprobe.core.metric` is built
from: at each chosen position (``[batch, seq]`` mask, :func:`~attnprobe.core.positions.
positions_mask`) the logit, probability or log-probability of one token per example
(``ids [batch]``) or of the input's next token, averaged over the positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from attnprobe.core.positions import Batch, Positions, positions_mask
from attnprobe.errors import InputError

__all__ = ["LogitTerms", "TokenRead", "join_terms", "logits_of", "next_ids", "sized_read"]


@dataclass(frozen=True)
class LogitTerms:
    """A linear metric as a sum of logits: example ``b`` scores
    ``Σ_i coeff[i] · logit[b, position[i], token[i]]`` over the entries with ``example == b``.
    Shapes: every field ``[n_terms]``."""

    example: torch.Tensor
    position: torch.Tensor
    token: torch.Tensor
    coeff: torch.Tensor


def logits_of(output: Any, spec: str) -> torch.Tensor:
    """Language-model logits ``[batch, seq, vocab]`` of an output."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, torch.Tensor):
        logits = output
    if logits is None and isinstance(output, (tuple, list)) and output \
            and isinstance(output[0], torch.Tensor):
        logits = output[0]
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        shape = list(logits.shape) if isinstance(logits, torch.Tensor) else None
        raise InputError(f"metric {spec} needs language-model logits [batch, seq, vocab]; the "
                         f"model gives {shape or type(output).__name__} (load it with its LM "
                         "head, or pass a callable metric)")
    return logits


def _gather(logits: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over the chosen positions of ``logits[b, p, tokens[b, p]]``, ``[batch]``."""
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [batch, seq]
    weights = mask.to(picked.dtype)
    return (picked * weights).sum(-1) / weights.sum(-1)


@dataclass(frozen=True)
class TokenRead:
    """What a kind reads at each chosen position: a token per example (``ids [batch]``) or
    the input's next token (``ids None``), turned into a number by ``how``."""

    spec: str
    ids: torch.Tensor | None
    positions: Positions
    how: str  # "logit" | "prob" | "logprob"
    answers: torch.Tensor | None = None  # [batch, seq]: a reference input's next tokens

    def tokens(self, batch: Batch) -> torch.Tensor:
        """``[batch, seq]``: the token read at each position."""
        input_ids = batch["input_ids"]
        if self.ids is not None:
            return self.ids.to(input_ids.device)[:, None].expand_as(input_ids)
        if self.answers is None:
            return next_ids(input_ids)
        if self.answers.shape != input_ids.shape:
            raise InputError(f"metric {self.spec} was fixed on a reference batch of shape "
                             f"{list(self.answers.shape)} and reads one of shape "
                             f"{list(input_ids.shape)}")
        return self.answers.to(input_ids.device)

    def held(self, batch: Batch) -> TokenRead:
        """This read with ``batch``'s next tokens as the answers of every run."""
        return replace(self, answers=next_ids(batch["input_ids"]).detach().cpu())

    def mask(self, batch: Batch) -> torch.Tensor:
        return positions_mask(self.positions, batch, needs_next=self.ids is None)

    def __call__(self, output: Any, batch: Batch) -> torch.Tensor:
        logits = logits_of(output, self.spec).float()
        _check_vocab(self.ids, logits.shape[-1], self.spec)
        if self.how == "prob":
            logits = logits.softmax(-1)
        elif self.how == "logprob":
            logits = logits.log_softmax(-1)
        mask = self.mask(batch).to(logits.device)
        return _gather(logits, mask, self.tokens(batch).to(logits.device))

    def terms(self, batch: Batch, sign: float = 1.0) -> LogitTerms:
        mask = self.mask(batch)
        example, position = mask.nonzero(as_tuple=True)
        per = mask.sum(-1).to(torch.float32)
        tokens = self.tokens(batch)[example, position]
        return LogitTerms(example, position, tokens, sign / per[example])


def next_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]``: each position's next token (0 after the last, never read)."""
    nxt = torch.zeros_like(input_ids)
    nxt[:, :-1] = input_ids[:, 1:]
    return nxt


def _check_vocab(ids: torch.Tensor | None, vocab: int, spec: str) -> None:
    if ids is not None and (ids.min() < 0 or ids.max() >= vocab):
        raise InputError(f"metric {spec}: token id {int(ids.max())} is outside the model's "
                         f"{vocab} logits")


def join_terms(*terms: LogitTerms) -> LogitTerms:
    return LogitTerms(*(torch.cat([getattr(t, name) for t in terms])
                        for name in ("example", "position", "token", "coeff")))


def sized_read(read: TokenRead, batch: Batch) -> TokenRead:
    n = int(batch["input_ids"].shape[0])
    if read.ids is None or read.ids.shape[0] == n:
        return read
    if read.ids.shape[0] != 1 and not bool((read.ids == read.ids[0]).all()):
        raise InputError(f"metric {read.spec} has {read.ids.shape[0]} tokens for a batch of "
                         f"{n} examples")
    return TokenRead(read.spec, read.ids[:1].expand(n), read.positions, read.how)
