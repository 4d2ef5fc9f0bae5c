"""One metric vocabulary for every causal experiment: what a run is scored by.

A :class:`Metric` reads one number per example off a forward's output (``[batch]``): the
quantity activation patching normalises, attention knockout and perturbations change, and
direct logit attribution decomposes. :func:`parse_metric` builds one from a spec:

=====================  =====================================================================
spec                   the number (per example; a mean over the chosen ``positions``)
=====================  =====================================================================
``next-token``         the logit of the model's own top next token at the last real
                       position, chosen once on a reference run (:meth:`Metric.fixed`; its
                       spec then names it: ``next-token:464``)
``logit:T``            the logit of token ``T`` (a word, a vocabulary string or an id)
``prob:T``             its probability (softmax over the vocabulary)
``logprob:T``          its log-probability
``logit_diff:A,B``     ``logit(A) - logit(B)``: the metric Heimersheim & Nanda recommend
                       for patching (probabilities saturate)
``loss``               the next-token cross-entropy of the input's own next token
``logit:next``         the logit of the input's own next token (``prob:next``,
                       ``logprob:next`` alike); needs a position whose next token is real
callable               ``(output, batch) -> Tensor[batch]``, recorded as ``custom``; a
                       callable of one argument (TransformerLens' ``lambda logits: ...``)
                       gets the logits ``[batch, seq, vocab]``
=====================  =====================================================================

**Tokens** (:mod:`attnprobe.core.metric_tokens`): the text after the colon is split on
commas, each name stripped, and read as the model reads it mid-sentence: on byte-level BPE
(GPT-2, Qwen2) ``logit_diff: Paris, Rome`` reads ``ĠParis`` and ``ĠRome``, on SentencePiece
(LLaMA) ``▁Paris`` and ``▁Rome``, on WordPiece ``paris`` and ``rome``. A name that is several
tokens is an error naming its pieces; an exact vocabulary string (``Ġc``) or an id (``464``)
names its token. The spec the tables record shows the resolved vocabulary strings
(``logit_diff:ĠParis,ĠRome``) and :attr:`Metric.tokens` their ids. From Python,
``logit_diff`` also takes one ``(A, B)`` pair per example (:func:`parse_metric`'s ``pairs``).

**Positions** (``positions=``): ``"last"`` (the default: each example's last real token, the
next-token prediction), ``"all"`` (every real position; for ``:next`` metrics and ``loss``
every position whose next token is real), one list of positions for every example, one list
per example, or a ``[batch, seq]`` bool mask; :func:`default_positions` is ``all`` for the
metrics that read the input's next token, ``last`` for the others.

**Across runs** (patching): a metric that reads the input's own next token (``:next``,
``loss``) is fixed on the reference run (:meth:`Metric.fixed`), so every run reads the
reference input's next tokens — the clean answer, not each run's own (``logit:next(clean)``
in a patching table, :meth:`Metric.named_for`).

Metrics that are linear in the logits (``next-token``, ``logit``, ``logit_diff``) expose
:meth:`Metric.logit_terms`: the logits they sum, with their coefficients, so that a direct
logit attribution can decompose them exactly. New kinds are entries of :data:`METRIC_KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnprobe.core.metric_callables import metric_function
from attnprobe.core.metric_reading import (
    LogitTerms,
    TokenRead,
    join_terms,
    logits_of,
    sized_read,
)
from attnprobe.core.metric_tokens import Resolved, resolve_token, token_id
from attnprobe.core.positions import Batch, Positions, batch_rows, positions_mask
from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError

__all__ = ["METRIC_KINDS", "LogitTerms", "Metric", "Positions", "default_positions",
           "parse_metric", "positions_mask", "reads_next_token", "token_id"]

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
        value = self.fn(output, batch)
        if not isinstance(value, torch.Tensor):
            raise InputError(f"metric {self.spec!r} returned {type(value).__name__}; a metric "
                             "returns a tensor [batch], one number per example")
        n = batch_rows(batch)
        if value.ndim != 1 or (n is not None and value.shape[0] != n):
            raise InputError(f"metric {self.spec!r} returned shape {tuple(value.shape)}; a "
                             f"metric returns one number per example, shape [{n}]")
        return value

    def logit_terms(self, batch: Batch) -> LogitTerms:
        """The logits this metric sums on ``batch`` (linear metrics only)."""
        if self.terms is None:
            raise InputError(f"metric {self.spec!r} is not a sum of logits; a direct logit "
                             "attribution needs logit:T, logit_diff:A,B or a fixed next-token")
        return self.terms(batch)

    def __repr__(self) -> str:
        return f"Metric({self.spec!r})"


# ---------------------------------------------------------------------------- kinds
Builder = Callable[[str, Any, Positions, int | None], Metric]
METRIC_KINDS: Registry[Builder] = Registry("metric kind")


def _resolved(token: str, tokenizer: Any, spec: str) -> Resolved:
    """The one token a kind reads (:mod:`attnprobe.core.metric_tokens`)."""
    if not token.strip():
        raise InputError(f"metric {spec} needs a token, e.g. '{spec.split(':')[0]}:Paris'")
    return resolve_token(token, tokenizer, spec)


def _ids(found: Resolved, n: int | None) -> torch.Tensor:
    """``[n or 1]``: the token's id once per example."""
    return torch.full((n or 1,), found.id, dtype=torch.long)


def _reading(how: str) -> Builder:
    def build(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
        if argument.strip() == "next":
            spec = f"{how}:next"
            return _held_reading(TokenRead(spec, None, positions, how))
        found = _resolved(argument, tokenizer, f"{how}:{argument.strip()}")
        spec = f"{how}:{found.shown}"
        read = TokenRead(spec, _ids(found, n), positions, how)
        return Metric(spec, _broadcast(read),
                      _broadcast_terms(read) if how == "logit" else None, tokens=(found,))

    return build


def _held_reading(read: TokenRead, anchor: bool = True) -> Metric:
    """A metric of the input's own next token; fixed on a reference batch, that batch's."""
    def held(batch: Batch) -> Metric:
        return _held_reading(read.held(batch), anchor=False)

    return Metric(read.spec, read, read.terms if read.how == "logit" else None,
                  anchor=held if anchor else None)


def _broadcast(read: TokenRead) -> MetricFn:
    """``read`` with its one token repeated over however many examples a batch has."""

    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return sized_read(read, batch)(output, batch)

    return fn


def _broadcast_terms(read: TokenRead, sign: float = 1.0) -> Callable[[Batch], LogitTerms]:
    def terms(batch: Batch) -> LogitTerms:
        return sized_read(read, batch).terms(batch, sign)

    return terms


for _how in ("logit", "prob", "logprob"):
    METRIC_KINDS.register(_how)(_reading(_how))


@METRIC_KINDS.register("logit_diff")
def _logit_diff(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    names = argument.split(",")
    written = f"logit_diff:{argument.strip()}"
    if len(names) != 2 or not all(name.strip() for name in names):
        raise InputError(f"metric {written} needs two tokens, e.g. 'logit_diff:Paris,Rome'")
    found = tuple(_resolved(name, tokenizer, written) for name in names)
    spec = "logit_diff:" + ",".join(f.shown for f in found)
    correct = TokenRead(spec, _ids(found[0], n), positions, "logit")
    wrong = TokenRead(spec, _ids(found[1], n), positions, "logit")
    return _difference(spec, correct, wrong, found)


def _difference(spec: str, correct: TokenRead, wrong: TokenRead, tokens: tuple[Resolved, ...]
                ) -> Metric:
    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return sized_read(correct, batch)(output, batch) - sized_read(wrong, batch)(output, batch)

    def terms(batch: Batch) -> LogitTerms:
        return join_terms(sized_read(correct, batch).terms(batch),
                          sized_read(wrong, batch).terms(batch, -1))

    return Metric(spec, fn, terms, tokens=tokens)


@METRIC_KINDS.register("loss")
def _loss(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    if argument.strip():
        raise InputError("metric loss takes no argument (choose where with positions=...)")
    return _loss_of(TokenRead("loss", None, "all" if positions == "last" else positions,
                          "logprob"))


def _loss_of(read: TokenRead, anchor: bool = True) -> Metric:
    """Minus the log-probability of the input's next tokens (of a reference batch's once
    fixed on it)."""
    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return -read(output, batch)

    def held(batch: Batch) -> Metric:
        return _loss_of(read.held(batch), anchor=False)

    return Metric("loss", fn, anchor=held if anchor else None)


@METRIC_KINDS.register("next-token")
def _next_token(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    if argument.strip():
        fixed = _reading("logit")(argument, tokenizer, positions, n)
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


def parse_metric(spec: str | Metric | MetricFn, tokenizer: Any = None, *,
                 positions: Positions = "last",
                 pairs: Sequence[tuple[str | int, str | int]] | None = None) -> Metric:
    """The :class:`Metric` a spec names (module docstring).

    Args:
        spec: a spec string, a :class:`Metric` (returned as it is) or a callable
            ``(output, batch) -> Tensor[batch]`` or ``(logits) -> Tensor[batch]`` (spec
            ``custom``; :func:`~attnprobe.core.metric_callables.metric_function`).
        tokenizer: turns token names into ids (module docstring: a name is read as the
            model reads it mid-sentence).
        positions: where the metric reads (module docstring); default the last real token.
        pairs: for ``logit_diff``, one ``(correct, wrong)`` pair per example instead of the
            spec's one pair (``spec="logit_diff"``).

    Raises:
        InputError: an unknown kind, a name that is not one token (its pieces named), a
            bad position, a callable that takes neither ``(output, batch)`` nor ``(logits)``.

    Example:
        >>> ids = lm_tok([prompt], return_tensors="pt")
        >>> logits = lm(**ids)                          # [batch, seq, vocab]
        >>> diff = parse_metric("logit_diff:t05,t11", lm_tok)
        >>> a, b = lm_tok.get_vocab()["t05"], lm_tok.get_vocab()["t11"]
        >>> torch.allclose(diff(logits, ids), logits[:, -1, a] - logits[:, -1, b])
        True
        >>> loss = parse_metric("loss", positions="all")(logits, ids)   # [batch]
        >>> nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids["input_ids"][0, 1:])
        >>> torch.allclose(loss, nll)
        True
    """
    if isinstance(spec, Metric):
        return spec
    if callable(spec) and not isinstance(spec, str):
        return Metric("custom", metric_function(spec, logits_of))
    if not isinstance(spec, str):
        raise InputError(f"metric must be a spec such as 'logit_diff:Paris,Rome', a Metric or a "
                         f"callable (output, batch) -> Tensor[batch]; got {type(spec).__name__}")
    kind, _, argument = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "logit_diff" and pairs is not None:
        if argument.strip():
            raise InputError("give the logit_diff tokens in the spec or as pairs=, not both")
        correct = [resolve_token(a, tokenizer, "logit_diff") for a, _ in pairs]
        wrong = [resolve_token(b, tokenizer, "logit_diff") for _, b in pairs]
        name = f"logit_diff:{len(pairs)} pairs"
        return _difference(name, TokenRead(name, torch.tensor([t.id for t in correct]), positions,
                                       "logit"),
                           TokenRead(name, torch.tensor([t.id for t in wrong]), positions, "logit"),
                           (*correct, *wrong))
    if kind not in METRIC_KINDS:
        raise InputError(one_of("metric kind", kind, METRIC_KINDS.names())
                         + " (e.g. 'logit_diff:Paris,Rome'), or pass a callable "
                         "(output, batch) -> Tensor[batch]")
    return METRIC_KINDS.get(kind)(argument, tokenizer, positions, None)


def default_positions(spec: Any) -> Positions:
    """Where a metric reads unless told: ``all`` for a spec that reads the input's own next
    token (``logit:next``, ``prob:next``, ``logprob:next``, ``loss``; the last position has
    none), ``last`` for every other spec and for a Metric or a callable.

    Example:
        >>> default_positions("logit:next"), default_positions("logit_diff:t05,t11")
        ('all', 'last')
    """
    return "all" if reads_next_token(spec) else "last"


def reads_next_token(spec: Any) -> bool:
    """Whether a spec reads the input's own next token (``:next`` kinds, ``loss``): a text
    of one token gives it nothing to read.

    Example:
        >>> reads_next_token("loss"), reads_next_token("logit:t05")
        (True, False)
    """
    if not isinstance(spec, str):
        return False
    kind, _, argument = spec.strip().partition(":")
    kind = kind.strip().lower()
    return kind == "loss" or (kind in ("logit", "prob", "logprob")
                              and argument.strip() == "next")
