"""The census's batches: sentences (raw texts or parsed trees) checked against the model's
length limit, sorted by length and encoded the one way the census runs them.

:func:`plan_batches` is public so that a benchmark can run a bare forward over exactly the
batches the census runs (``analyses/bench_census.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.heads.trees import Tree
from attnprobe.inputs.prepared import PreparedCorpus, TokenFacts, facts_of, prepared_with
from attnprobe.inputs.text import (
    Text,
    TokenRow,
    encode,
    model_inputs,
    pad_ids,
    pad_rows,
)
from attnprobe.inputs.token_ids import input_vocab_size

__all__ = ["CensusBatch", "Sentence", "plan_batches"]


@dataclass(frozen=True)
class Sentence:
    """One sentence to run: its words (when it has a tree) or text (a string or token ids),
    and its token count."""

    index: int
    sentence_id: str
    text: Text | None
    tree: Tree | None
    n_tokens: int
    ids: tuple[int, ...] = ()  # a tree's tokens, as planning tokenized them
    word_ids: tuple[int, ...] = ()  # each token's word (-1: special)
    row: TokenRow | None = None  # a text's tokens, as planning tokenized them


@dataclass(frozen=True, eq=False)
class CensusBatch:
    """Sentences of similar length that run in one forward."""

    sentences: tuple[Sentence, ...]
    model: nn.Module
    tokenizer: Any
    truncation: str
    max_length: int | None

    def inputs(self) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """Model inputs on the model's device, and ``[batch, token]`` word index of each token
        (-1: special/padding; ``None`` for raw texts)."""
        items = self.sentences
        if items[0].tree is None:
            if self.truncation == "cut":  # cut the tokenizer's way (its end tokens kept)
                batch = encode(self.model, self.tokenizer, [it.text for it in items],
                               max_length=self.max_length, truncation=self.truncation)
            else:  # tokenized once, when planning
                batch = pad_rows(self.model, self.tokenizer, [it.row for it in items])
            return model_inputs(self.model, batch), None
        # tokenized once, when planning; padded here (no pad token needed)
        batch = pad_ids(self.model, self.tokenizer, [it.ids for it in items])
        token_word = torch.full_like(batch["input_ids"], -1)
        for b, it in enumerate(items):
            token_word[b, :len(it.word_ids)] = torch.tensor(it.word_ids, dtype=torch.long)
        return model_inputs(self.model, batch), token_word


def _tree_tokens(model: nn.Module, tokenizer: Any, trees: Sequence[Tree]
                 ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each tree's token ids and the word of each token (-1: special), checked."""
    try:
        enc = tokenizer([list(t.words) for t in trees], is_split_into_words=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"this tokenizer cannot take pre-split words ({exc}); "
                         "syntax needs a tokenizer that can") from None
    vocab = input_vocab_size(model)
    for b, tree in enumerate(trees):
        ids = enc["input_ids"][b]
        if vocab is not None and ids and max(ids) >= vocab:
            raise InputError(f"sentence {tree.sentence_id} gives token id {max(ids)} but the "
                             f"model has {vocab} input embeddings (ids 0..{vocab - 1}): the "
                             "tokenizer does not belong to this model")
        covered = {w for w in enc.word_ids(b) if w is not None}
        if len(covered) != len(tree.words):
            missing = sorted(set(range(len(tree.words))) - covered)[0]
            raise InputError(f"sentence {tree.sentence_id}: word {missing + 1} "
                             f"{tree.words[missing]!r} gives no token")
    return [(tuple(ids), tuple(-1 if w is None else w for w in enc.word_ids(b)))
            for b, ids in enumerate(enc["input_ids"])]


def _sentences(facts: TokenFacts, texts: PreparedCorpus | None,
               trees: Sequence[Tree] | None, max_length: int | None,
               truncation: str) -> tuple[list[Sentence], tuple[str, ...]]:
    model, tokenizer = facts.model, facts.tokenizer
    if truncation == "cut" and trees is not None:
        raise InputError("a parsed sentence cannot be cut (its tree would no longer match); "
                         "use truncation='skip' (CLI --skip-long)")
    tokens = _tree_tokens(model, tokenizer, trees) if trees is not None else None
    # texts are checked as every corpus analysis checks them (capture.text)
    rows = texts.rows() if texts is not None else None
    lengths = [len(ids) for ids, _ in tokens] if tokens is not None else \
        [len(row.ids) for row in rows]
    limit = facts.limit(max_length)
    items, skipped = [], []
    for i, n in enumerate(lengths):
        tree = trees[i] if trees is not None else None
        sentence_id = tree.sentence_id if tree is not None else str(i)
        if limit is not None and n > limit and truncation != "cut":
            if truncation == "error":
                raise InputError(f"sentence {sentence_id} has {n} tokens but the model takes at "
                                 f"most {limit}; shorten it or pass truncation='skip' "
                                 "(CLI: --skip-long)")
            skipped.append(sentence_id)
            continue
        text = texts[i] if texts is not None else None
        ids, word_ids = tokens[i] if tokens is not None else ((), ())
        items.append(Sentence(i, sentence_id, text, tree, min(n, limit or n), ids, word_ids,
                              rows[i] if rows is not None else None))
    if not items:
        raise InputError(f"every sentence was skipped as too long ({len(skipped)})")
    return items, tuple(skipped)


def plan_batches(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | None = None, *,
                 trees: Sequence[Tree] | None = None, batch_size: int,
                 truncation: str = "error", max_length: int | None = None,
                 facts: TokenFacts | None = None
                 ) -> tuple[list[CensusBatch], tuple[str, ...]]:
    """The census's batches (sentences sorted by length, so a batch holds similar lengths and
    little padding) and the ids of sentences skipped as too long. ``texts`` may be a
    :class:`~attnprobe.inputs.prepared.PreparedCorpus` and ``facts`` the model's
    :class:`~attnprobe.inputs.prepared.TokenFacts` (read, not computed again)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer; got {batch_size!r}")
    facts = facts if facts is not None else facts_of(model, tokenizer, texts)
    prepared = prepared_with(facts, texts) if texts is not None else None
    items, skipped = _sentences(facts, prepared, trees, max_length, truncation)
    ordered = sorted(items, key=lambda it: (it.n_tokens, it.index))
    batches = [CensusBatch(tuple(ordered[i:i + batch_size]), model, tokenizer, truncation,
                           max_length) for i in range(0, len(ordered), batch_size)]
    return batches, skipped
