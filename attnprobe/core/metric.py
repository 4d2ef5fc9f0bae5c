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
``logit:T``            the logit of token ``T`` (a token string or an id)
``prob:T``             its probability (softmax over the vocabulary)
``logprob:T``          its log-probability
``logit_diff:A,B``     ``logit(A) - logit(B)``: the metric Heimersheim & Nanda recommend
                       for patching (probabilities saturate)
``loss``               the next-token cross-entropy of the input's own next token
``logit:next``         the logit of the input's own next token (``prob:next``,
                       ``logprob:next`` alike); needs a position whose next token is real
callable               ``(output, batch) -> Tensor[batch]``, recorded as ``custom``
=====================  =====================================================================

Tokens in a spec are token strings (one token each, through the tokenizer) or ids; from
Python, ``logit_diff`` also takes one ``(A, B)`` pair per example
(:func:`parse_metric`'s ``pairs``). **Positions** (``positions=``): ``"last"`` (the default:
each example's last real token, the next-token prediction), ``"all"`` (every real position;
for ``:next`` metrics and ``loss`` every position whose next token is real), one list of
positions for every example, one list per example, or a ``[batch, seq]`` bool mask.

Metrics that are linear in the logits (``next-token``, ``logit``, ``logit_diff``) expose
:meth:`Metric.logit_terms`: the logits they sum, with their coefficients, so that a direct
logit attribution can decompose them exactly. New kinds are entries of :data:`METRIC_KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnprobe.core.positions import Batch, Positions, batch_rows, positions_mask
from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError

__all__ = ["METRIC_KINDS", "LogitTerms", "Metric", "Positions", "parse_metric",
           "positions_mask", "token_id"]

MetricFn = Callable[[Any, Batch], torch.Tensor]


@dataclass(frozen=True)
class LogitTerms:
    """A linear metric as a sum of logits: example ``b`` scores
    ``Σ_i coeff[i] · logit[b, position[i], token[i]]`` over the entries with ``example == b``.
    Shapes: every field ``[n_terms]``."""

    example: torch.Tensor
    position: torch.Tensor
    token: torch.Tensor
    coeff: torch.Tensor


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
    """

    spec: str
    fn: MetricFn | None = field(default=None, repr=False)
    terms: Callable[[Batch], LogitTerms] | None = field(default=None, repr=False)
    choose: Callable[[Any, Batch], Metric] | None = field(default=None, repr=False)

    @property
    def ready(self) -> bool:
        """False while the metric still has to be fixed on a reference run."""
        return self.choose is None

    @property
    def linear(self) -> bool:
        """Whether the metric is a sum of logits (:meth:`logit_terms`)."""
        return self.terms is not None or self.choose is not None

    def fixed(self, output: Any, batch: Batch) -> Metric:
        """The metric held fixed on this reference run (``next-token`` picks its tokens)."""
        if self.choose is None:
            return self
        with torch.no_grad():
            return self.choose(output, batch)

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


# ---------------------------------------------------------------------------- reading outputs
def _logits(output: Any, spec: str) -> torch.Tensor:
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


def token_id(token: str | int, tokenizer: Any, spec: str) -> int:
    """The id of one token given as an id or a string (which must be one token).

    Example:
        >>> token_id("t05", lm_tok, "logit:t05") == lm_tok.get_vocab()["t05"]
        True
        >>> token_id("464", None, "logit:464")          # an id needs no tokenizer
        464
    """
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    text = str(token).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if tokenizer is None:
        raise InputError(f"metric {spec} names the token {text!r}; pass a tokenizer or an id")
    vocab = getattr(tokenizer, "get_vocab", None)
    found = vocab().get(text) if callable(vocab) else None
    unknown = InputError(f"metric {spec}: {text!r} is not in the tokenizer's vocabulary; name "
                         "one token (its string or its id)")
    if found is None:
        try:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] \
                if callable(tokenizer) else []
        except TypeError:  # a word tokenizer without add_special_tokens: not in its vocab
            raise unknown from None
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        if len(ids) != 1:
            raise InputError(f"metric {spec}: {text!r} is {len(ids)} tokens, not one; name one "
                             "token (its string or its id)")
        found = ids[0]
    if found == getattr(tokenizer, "unk_token_id", None) \
            and text != getattr(tokenizer, "unk_token", None):  # read as the unknown token
        raise unknown
    return int(found)


def _gather(logits: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over the chosen positions of ``logits[b, p, tokens[b, p]]``, ``[batch]``."""
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [batch, seq]
    weights = mask.to(picked.dtype)
    return (picked * weights).sum(-1) / weights.sum(-1)


@dataclass(frozen=True)
class _Read:
    """What a kind reads at each chosen position: a token per example (``ids [batch]``) or
    the input's next token (``ids None``), turned into a number by ``how``."""

    spec: str
    ids: torch.Tensor | None
    positions: Positions
    how: str  # "logit" | "prob" | "logprob"

    def tokens(self, batch: Batch) -> torch.Tensor:
        """``[batch, seq]``: the token read at each position."""
        input_ids = batch["input_ids"]
        if self.ids is None:
            nxt = torch.zeros_like(input_ids)
            nxt[:, :-1] = input_ids[:, 1:]
            return nxt
        return self.ids.to(input_ids.device)[:, None].expand_as(input_ids)

    def mask(self, batch: Batch) -> torch.Tensor:
        return positions_mask(self.positions, batch, needs_next=self.ids is None)

    def __call__(self, output: Any, batch: Batch) -> torch.Tensor:
        logits = _logits(output, self.spec).float()
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


def _check_vocab(ids: torch.Tensor | None, vocab: int, spec: str) -> None:
    if ids is not None and (ids.min() < 0 or ids.max() >= vocab):
        raise InputError(f"metric {spec}: token id {int(ids.max())} is outside the model's "
                         f"{vocab} logits")


def _join(*terms: LogitTerms) -> LogitTerms:
    return LogitTerms(*(torch.cat([getattr(t, name) for t in terms])
                        for name in ("example", "position", "token", "coeff")))


# ---------------------------------------------------------------------------- kinds
Builder = Callable[[str, Any, Positions, int | None], Metric]
METRIC_KINDS: Registry[Builder] = Registry("metric kind")


def _ids(token: str, tokenizer: Any, spec: str, n: int | None) -> torch.Tensor | None:
    """The token read by a kind: ``None`` for ``next``, else one id for every example."""
    if token.strip() == "next":
        return None
    if not token.strip():
        raise InputError(f"metric {spec} needs a token, e.g. '{spec.split(':')[0]}:Paris'")
    return torch.full((n or 1,), token_id(token, tokenizer, spec), dtype=torch.long)


def _reading(how: str) -> Builder:
    def build(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
        spec = f"{how}:{argument.strip()}"
        read = _Read(spec, _ids(argument, tokenizer, spec, n), positions, how)
        fn = _broadcast(read)
        return Metric(spec, fn, _broadcast_terms(read) if how == "logit" else None)

    return build


def _broadcast(read: _Read) -> MetricFn:
    """``read`` with its one token repeated over however many examples a batch has."""

    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return _sized(read, batch)(output, batch)

    return fn


def _broadcast_terms(read: _Read, sign: float = 1.0) -> Callable[[Batch], LogitTerms]:
    def terms(batch: Batch) -> LogitTerms:
        return _sized(read, batch).terms(batch, sign)

    return terms


def _sized(read: _Read, batch: Batch) -> _Read:
    n = int(batch["input_ids"].shape[0])
    if read.ids is None or read.ids.shape[0] == n:
        return read
    if read.ids.shape[0] != 1 and not bool((read.ids == read.ids[0]).all()):
        raise InputError(f"metric {read.spec} has {read.ids.shape[0]} tokens for a batch of "
                         f"{n} examples")
    return _Read(read.spec, read.ids[:1].expand(n), read.positions, read.how)


for _how in ("logit", "prob", "logprob"):
    METRIC_KINDS.register(_how)(_reading(_how))


@METRIC_KINDS.register("logit_diff")
def _logit_diff(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    first, comma, second = argument.partition(",")
    spec = f"logit_diff:{argument.strip()}"
    if not comma or not first.strip() or not second.strip():
        raise InputError(f"metric {spec} needs two tokens, e.g. 'logit_diff:Paris,Rome'")
    correct = _Read(spec, _ids(first, tokenizer, spec, n), positions, "logit")
    wrong = _Read(spec, _ids(second, tokenizer, spec, n), positions, "logit")
    return _difference(spec, correct, wrong)


def _difference(spec: str, correct: _Read, wrong: _Read) -> Metric:
    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return _sized(correct, batch)(output, batch) - _sized(wrong, batch)(output, batch)

    def terms(batch: Batch) -> LogitTerms:
        return _join(_sized(correct, batch).terms(batch), _sized(wrong, batch).terms(batch, -1))

    return Metric(spec, fn, terms)


@METRIC_KINDS.register("loss")
def _loss(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    if argument.strip():
        raise InputError("metric loss takes no argument (choose where with positions=...)")
    read = _Read("loss", None, "all" if positions == "last" else positions, "logprob")

    def fn(output: Any, batch: Batch) -> torch.Tensor:
        return -read(output, batch)

    return Metric("loss", fn)


@METRIC_KINDS.register("next-token")
def _next_token(argument: str, tokenizer: Any, positions: Positions, n: int | None) -> Metric:
    if argument.strip():
        fixed = _reading("logit")(argument, tokenizer, positions, n)
        return Metric(f"next-token:{argument.strip()}", fixed.fn, fixed.terms)

    def choose(output: Any, batch: Batch) -> Metric:
        logits = _logits(output, "next-token")
        mask = positions_mask(positions, batch)
        if (mask.sum(-1) != 1).any():
            raise InputError("next-token reads one position per example (positions='last' or "
                             "one position each)")
        slot = mask.long().argmax(-1)
        top = logits[torch.arange(logits.shape[0]), slot].argmax(-1)  # [batch]
        spec = "next-token:" + ",".join(str(int(t)) for t in top.unique())
        read = _Read(spec, top.detach().cpu(), positions, "logit")
        return Metric(spec, read, read.terms)

    return Metric("next-token", choose=choose)


def parse_metric(spec: str | Metric | MetricFn, tokenizer: Any = None, *,
                 positions: Positions = "last",
                 pairs: Sequence[tuple[str | int, str | int]] | None = None) -> Metric:
    """The :class:`Metric` a spec names (module docstring).

    Args:
        spec: a spec string, a :class:`Metric` (returned as it is) or a callable
            ``(output, batch) -> Tensor[batch]`` (spec ``custom``).
        tokenizer: turns token strings into ids.
        positions: where the metric reads (module docstring); default the last real token.
        pairs: for ``logit_diff``, one ``(correct, wrong)`` pair per example instead of the
            spec's one pair (``spec="logit_diff"``).

    Raises:
        InputError: an unknown kind, a token that is not one token, a bad position.

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
        return Metric("custom", spec)
    if not isinstance(spec, str):
        raise InputError(f"metric must be a spec such as 'logit_diff:Paris,Rome', a Metric or a "
                         f"callable (output, batch) -> Tensor[batch]; got {type(spec).__name__}")
    kind, _, argument = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "logit_diff" and pairs is not None:
        if argument.strip():
            raise InputError("give the logit_diff tokens in the spec or as pairs=, not both")
        correct = [token_id(a, tokenizer, "logit_diff") for a, _ in pairs]
        wrong = [token_id(b, tokenizer, "logit_diff") for _, b in pairs]
        name = f"logit_diff:{len(pairs)} pairs"
        return _difference(name, _Read(name, torch.tensor(correct), positions, "logit"),
                           _Read(name, torch.tensor(wrong), positions, "logit"))
    if kind not in METRIC_KINDS:
        raise InputError(one_of("metric kind", kind, METRIC_KINDS.names())
                         + " (e.g. 'logit_diff:Paris,Rome'), or pass a callable "
                         "(output, batch) -> Tensor[batch]")
    return METRIC_KINDS.get(kind)(argument, tokenizer, positions, None)
