"""A corpus prepared once for one model and tokenizer, handed from analysis to analysis.

A run that chains analyses (the report's pipeline: the census, the attention views, the
comparison, the causal sections) reads the same facts about its texts many times: the most
tokens the model takes (:func:`~attnprobe.inputs.length_limit.max_length_of`), the
tokenizer's special-token and vocabulary classes (:func:`~attnprobe.core.tokens.
token_classes`), and each text's tokens (:func:`~attnprobe.inputs.text.token_rows`).
:class:`PreparedCorpus` computes each of them on first use, once, and every analysis that is
given it reads them from there.

A :class:`PreparedCorpus` is a sequence of its texts, so it goes wherever texts go: an
analysis that does not know it sees the texts. Its first ``n`` texts (``prepared.head(n)`` or
``prepared[:n]``, what the report's views read) share the facts already computed.
:func:`prepare` is the one call an analysis makes: it returns the caller's prepared corpus
when it was prepared for the same model and tokenizer, else prepares the texts.

Example:
    >>> prepared = prepare(model, tok, ["The cat sat.", "A dog barked."])
    >>> census(model, tok, prepared); extract(model, tok, prepared[:1])  # rows read once
    >>> prepared.facts.max_length                      # the model's own limit, read once
    512
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any, overload

import torch
from torch import nn

from attnprobe.core.corpus_options import Truncation, truncation_mode
from attnprobe.core.tokens import token_classes
from attnprobe.errors import InputError
from attnprobe.inputs.length_limit import max_length_of
from attnprobe.inputs.text import Corpus, Text, TokenRow, encode, pad_rows, token_rows
from attnprobe.inputs.token_ids import check_inputs

__all__ = ["PreparedCorpus", "TokenFacts", "facts_of", "prepare", "prepared_with", "too_long"]


def too_long(index: int | str, n_tokens: int, limit: int) -> str:
    """The one message for a text over the limit under ``truncation="error"``."""
    return (f"text {index} has {n_tokens} tokens but the model takes at most {limit}; cut it "
            "(truncation='cut', CLI --truncate) or leave it out (truncation='skip', CLI "
            "--skip-long)")


class TokenFacts:
    """What one (model, tokenizer) pair gives every text of a run, each read on first use.

    Attributes:
        model / tokenizer: the pair the facts are about.
    """

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def serves(self, model: nn.Module, tokenizer: Any) -> bool:
        """Whether these are the facts of ``model`` and ``tokenizer`` (the same objects)."""
        return self.model is model and self.tokenizer is tokenizer

    @cached_property
    def max_length(self) -> int | None:
        """The most tokens the model accepts (:func:`max_length_of`), None when unknown."""
        return max_length_of(self.model, self.tokenizer)

    @cached_property
    def classes(self) -> dict[str, torch.Tensor]:
        """The tokenizer's id sets per token class (:func:`token_classes`)."""
        return token_classes(self.tokenizer)

    def limit(self, max_length: int | None = None) -> int | None:
        """The most tokens per text: the model's own limit lowered to ``max_length`` (as
        :func:`~attnprobe.inputs.length_limit.token_limit` gives it)."""
        if max_length is not None and (isinstance(max_length, bool)
                                       or not isinstance(max_length, int) or max_length < 1):
            raise InputError(f"max_length must be a positive integer; got {max_length!r}")
        own = self.max_length
        if max_length is None:
            return own
        return min(own, max_length) if own else max_length


def facts_of(model: nn.Module, tokenizer: Any, texts: Any = None) -> TokenFacts:
    """The facts of ``texts`` when it is a corpus prepared for ``model`` and ``tokenizer``,
    else new ones."""
    if isinstance(texts, PreparedCorpus) and texts.facts.serves(model, tokenizer):
        return texts.facts
    return TokenFacts(model, tokenizer)


class _Rows:
    """Token rows of a corpus's texts, tokenized once (the longest prefix asked so far)."""

    def __init__(self, facts: TokenFacts, texts: tuple[Text, ...]) -> None:
        self.facts = facts
        self.texts = texts
        self.done: list[TokenRow] = []

    def first(self, n: int) -> list[TokenRow]:
        if len(self.done) < n:  # tokenized as one list, so messages name the caller's index
            self.done = token_rows(self.facts.tokenizer, list(self.texts[:n]),
                                   model=self.facts.model)
        return self.done[:n]


class PreparedCorpus(Sequence[Text]):
    """Texts (strings and token ids, checked) with their :class:`TokenFacts` and token rows,
    each computed once (module docstring). Build it with :func:`prepare`."""

    def __init__(self, facts: TokenFacts, texts: Sequence[Text] | Any) -> None:
        self.facts = facts
        self._rows = _Rows(facts, tuple(check_inputs(texts)))
        self._stop = len(self._rows.texts)

    @property
    def texts(self) -> tuple[Text, ...]:
        """The texts, as checked."""
        return self._rows.texts[:self._stop]

    def __len__(self) -> int:
        return self._stop

    @overload
    def __getitem__(self, index: int) -> Text: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Text]: ...

    def __getitem__(self, index: int | slice) -> Text | Sequence[Text]:
        """A text; a slice from the start (``[:n]``) is a prepared corpus sharing what was
        computed, any other slice a list of texts."""
        if not isinstance(index, slice):
            return self.texts[index]
        start, stop, step = index.indices(self._stop)
        if start == 0 and step == 1:
            return self.head(stop)
        return list(self.texts[index])

    def head(self, n: int) -> PreparedCorpus:
        """The first ``n`` texts (all when fewer), sharing what was computed."""
        first = copy.copy(self)  # the same facts and rows, fewer texts
        first._stop = max(min(n, self._stop), 0)
        return first

    def __iter__(self) -> Iterator[Text]:
        return iter(self.texts)

    def __repr__(self) -> str:
        return f"PreparedCorpus({self._stop} texts)"

    def rows(self) -> list[TokenRow]:
        """Each text's tokens (special tokens included, uncut), checked: every string gives
        a token besides special tokens, every id fits the model's input embedding."""
        return self._rows.first(self._stop)

    def lengths(self) -> list[int]:
        """Tokens of each text (:meth:`rows`)."""
        return [len(row.ids) for row in self.rows()]

    def corpus(self, *, truncation: Truncation = "error",
               max_length: int | None = None) -> Corpus:
        """The texts an analysis runs on (:func:`~attnprobe.inputs.text.prepare_corpus`):
        a text over the limit is an error naming it (``"error"``), left out (``"skip"``) or
        left to be cut (``"cut"``)."""
        mode = truncation_mode(truncation)
        limit = self.facts.limit(max_length)
        lengths = self.lengths()
        ids = [str(i) for i in range(len(self))]
        if mode == "cut" or limit is None:
            return Corpus(self.texts, tuple(ids))
        long = [i for i, n in enumerate(lengths) if n > limit]
        if long and mode == "error":
            raise InputError(too_long(long[0], lengths[long[0]], limit))
        if len(long) == len(self):
            raise InputError(f"every text is longer than the model allows ({limit} tokens); "
                             "nothing is left after truncation='skip'")
        out = set(long)
        keep = [i for i in range(len(self)) if i not in out]
        return Corpus(tuple(self.texts[i] for i in keep), tuple(ids[i] for i in keep),
                      tuple(ids[i] for i in long))

    def inputs(self, indices: Sequence[int], *, truncation: Truncation = "error",
               max_length: int | None = None) -> dict[str, torch.Tensor]:
        """The texts at ``indices`` as one padded batch, as
        :func:`~attnprobe.inputs.text.encode` gives it: from the rows already tokenized;
        a batch holding a text to cut is encoded the tokenizer's way (its end tokens
        kept)."""
        rows = self.rows()
        limit = self.facts.limit(max_length)
        chosen = [rows[i] for i in indices]
        if limit is not None and any(len(row.ids) > limit for row in chosen):
            return encode(self.facts.model, self.facts.tokenizer,
                          [self.texts[i] for i in indices], max_length=max_length,
                          truncation=truncation)
        return pad_rows(self.facts.model, self.facts.tokenizer, chosen)


def prepare(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any) -> PreparedCorpus:
    """``texts`` prepared for ``model`` and ``tokenizer``: the caller's
    :class:`PreparedCorpus` when it was prepared for them, else a new one (checked as
    every corpus analysis checks its texts)."""
    return prepared_with(facts_of(model, tokenizer, texts), texts)


def prepared_with(facts: TokenFacts, texts: Sequence[Text] | Any) -> PreparedCorpus:
    """``texts`` as a corpus prepared with ``facts``: the caller's when it already is."""
    if isinstance(texts, PreparedCorpus):
        return texts if texts.facts is facts else PreparedCorpus(facts, texts.texts)
    return PreparedCorpus(facts, texts)
