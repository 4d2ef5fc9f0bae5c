"""The head census: every per-head score over a corpus, streamed batch by batch.

:func:`census` runs the model once per batch inside :func:`~attnprobe.capture.capture`.
Streaming reducers (entropy, offsets, token classes, token matches, segments) see the
weights as they are computed; when trees are given (or parsed) the batch's padded weights
are also turned into word-level maps and scored against the dependency relations, and head
distances (Jensen–Shannon) are accumulated. Each batch yields a mergeable part; parts are
summed in batch order, so a run split across processes (``torch.distributed``) gives the
same numbers as one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.capture.calls import BatchPatterns, positions
from attnprobe.errors import InputError
from attnprobe.extraction import _model_inputs, check_texts, max_length_of
from attnprobe.heads import labels
from attnprobe.heads.census_stats import token_classes
from attnprobe.heads.probe import repeated_token_scores
from attnprobe.heads.reducers import Reducer, RowBlock, Tally
from attnprobe.heads.scores import INDEX, census_reducers, offset_table, wide_scores
from attnprobe.heads.similarity import HeadDistances, cluster_heads
from attnprobe.heads.syntax import SyntaxCounts, score_batch
from attnprobe.heads.trees import Tree, parse
from attnprobe.heads.words import to_words


@dataclass
class StackedSums:
    """Reducer sums of every layer of one (stack, kind) at once, ``[layer * head]`` per
    statistic. Batches add these; they are split into a per-layer :class:`Tally` once, at
    the end (splitting per batch costs more than the statistics themselves)."""

    stack: str
    kind: str
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    rows: float
    sums: dict[str, Any]

    def __add__(self, other: StackedSums) -> StackedSums:
        if (self.stack, self.kind, self.layers, self.heads) != \
                (other.stack, other.kind, other.layers, other.heads):
            raise InputError("cannot add sums of different attention sites")
        sums = dict(self.sums)
        for name, value in other.sums.items():
            if name not in sums:
                sums[name] = value
            elif isinstance(value, tuple):
                sums[name] = (sums[name][0] + value[0], sums[name][1] + value[1])
            else:
                sums[name] = sums[name] + value
        return StackedSums(self.stack, self.kind, self.layers, self.heads,
                           self.rows + other.rows, sums)

    def to_tally(self) -> Tally:
        tally = Tally()
        n_heads = len(self.heads)
        for li, layer in enumerate(self.layers):
            heads = slice(li * n_heads, (li + 1) * n_heads)
            layer_sums = {name: tuple(v[heads] for v in value) if isinstance(value, tuple)
                          else value[heads] for name, value in self.sums.items()}
            tally.add_sums((self.stack, self.kind, layer), self.heads, self.rows, layer_sums)
        return tally


@dataclass
class CensusPart:
    """What one batch contributed; parts add exactly."""

    tally: Tally = field(default_factory=Tally)
    stacked: dict[tuple[str, str], StackedSums] = field(default_factory=dict)
    syntax: SyntaxCounts | None = None
    distances: HeadDistances | None = None
    sentences: int = 0

    def __add__(self, other: CensusPart) -> CensusPart:
        def plus(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else a + b

        stacked = dict(self.stacked)
        for key, value in other.stacked.items():
            stacked[key] = plus(stacked.get(key), value)
        return CensusPart(self.tally + other.tally, stacked, plus(self.syntax, other.syntax),
                          plus(self.distances, other.distances),
                          self.sentences + other.sentences)

    def full_tally(self) -> Tally:
        """Streaming and stacked sums together, per (stack, kind, layer)."""
        return sum((s.to_tally() for s in self.stacked.values()), self.tally)


@dataclass
class Census:
    """Census results. Tables are computed from the merged sums on request.

    Attributes:
        part: merged sums (tally of streaming statistics, syntax counts, head distances).
        skipped: ids of sentences left out because they were too long (``on_long="skip"``).
        window: offsets ±window get their own score column.
        probe: the repeated-random-token probe's tally (``rep_*`` scores), kept apart from
            the corpus sums so its rows never dilute corpus means.
    """

    part: CensusPart
    skipped: tuple[str, ...] = ()
    window: int = 3
    min_count: int = 20
    probe: Tally | None = None

    @property
    def n_sentences(self) -> int:
        return self.part.sentences

    @property
    def tally(self) -> Tally:
        """Every streaming statistic, per (stack, kind, layer) and head (mergeable)."""
        return self.part.full_tally()

    def scores(self) -> pd.DataFrame:
        """One row per head, every score (columns in ``attnprobe.heads.scores``)."""
        extras = []
        if self.part.syntax is not None:
            extras.append(self.part.syntax.per_head(self.min_count))
        if self.probe is not None:  # its own rows: never averaged with the corpus'
            probe = wide_scores(self.probe)
            extras.append(probe[[*INDEX[:4], *(c for c in probe if c.startswith("rep_"))]])
        extra = None
        for frame in extras:
            extra = frame if extra is None else extra.merge(frame, on=INDEX[:4], how="outer")
        return wide_scores(self.tally, window=self.window, extra=extra)

    def classify(self, thresholds: labels.Thresholds | None = None) -> pd.DataFrame:
        """Scores plus ``label``, ``evidence`` and ``also`` per head."""
        return labels.classify_scores(self.scores(), thresholds)

    def layer_profile(self, thresholds: labels.Thresholds | None = None
                      ) -> pd.DataFrame:
        return labels.layer_profile(self.classify(thresholds))

    def syntax(self, min_count: int = 1) -> pd.DataFrame:
        """Best head per relation vs the best fixed-offset baseline (Clark et al. Table 1)."""
        if self.part.syntax is None:
            raise InputError("this census had no dependency trees; pass trees= or syntax=True")
        return self.part.syntax.table(min_count)

    def offsets(self) -> pd.DataFrame:
        """Mass and argmax share at every relative offset, per head (long form)."""
        return offset_table(self.tally)

    def distances(self) -> pd.DataFrame:
        """Mean Jensen–Shannon divergence between every pair of heads (long form)."""
        if self.part.distances is None:
            raise InputError("head distances were not computed (similarity=False)")
        return self.part.distances.to_frame()

    def clusters(self, n_clusters: int = 6) -> pd.DataFrame:
        """Heads grouped by their JS distances, with 2-D MDS coordinates."""
        if self.part.distances is None:
            raise InputError("head distances were not computed (similarity=False)")
        return cluster_heads(self.part.distances, n_clusters)


@dataclass(frozen=True)
class _Item:
    """One sentence to run: its words (when it has a tree) or text, and its token count."""

    index: int
    sentence_id: str
    text: str | None
    tree: Tree | None
    n_tokens: int


def _encode(tokenizer: Any, items: Sequence[_Item]) -> tuple[dict[str, torch.Tensor],
                                                                torch.Tensor | None]:
    """Padded batch, and ``[batch, token]`` word index of each token (-1: special/padding)."""
    if items[0].tree is None:
        enc = tokenizer([_pair(it.text) for it in items], padding=True, return_tensors="pt")
        return dict(enc), None
    words = [list(it.tree.words) for it in items]
    enc = tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")
    token_word = torch.tensor([[-1 if w is None else w for w in enc.word_ids(b)]
                               for b in range(len(items))], dtype=torch.long)
    return dict(enc), token_word


def _lengths(tokenizer: Any, texts: Sequence[str] | None,
             trees: Sequence[Tree] | None) -> list[int]:
    if trees is not None:
        try:
            enc = tokenizer([list(t.words) for t in trees], is_split_into_words=True)
        except (TypeError, ValueError) as exc:
            raise InputError(f"this tokenizer cannot take pre-split words ({exc}); "
                             "syntax needs a tokenizer that can") from None
        lengths = [len(ids) for ids in enc["input_ids"]]
        for tree, b in zip(trees, range(len(trees)), strict=True):
            covered = {w for w in enc.word_ids(b) if w is not None}
            if len(covered) != len(tree.words):
                missing = sorted(set(range(len(tree.words))) - covered)[0]
                raise InputError(f"sentence {tree.sentence_id}: word {missing + 1} "
                                 f"{tree.words[missing]!r} gives no token")
        return lengths
    return [len(ids) for ids in tokenizer([_pair(t) for t in texts])["input_ids"]]


def _pair(text: str) -> str | tuple[str, str]:
    """A text with a tab is a sentence pair (encoded ``[CLS] a [SEP] b [SEP]`` by BERT)."""
    first, tab, second = text.partition("\t")
    return (first, second) if tab else text


def _items(model: nn.Module, tokenizer: Any, texts: Sequence[str] | None,
           trees: Sequence[Tree] | None, max_length: int | None,
           on_long: str) -> tuple[list[_Item], tuple[str, ...]]:
    if on_long not in ("error", "skip"):
        raise InputError(f"on_long must be 'error' or 'skip'; got {on_long!r}")
    lengths = _lengths(tokenizer, texts, trees)
    limit = max_length_of(model, tokenizer)
    if max_length is not None:
        limit = min(limit, max_length) if limit else max_length
    items, skipped = [], []
    for i, n in enumerate(lengths):
        tree = trees[i] if trees is not None else None
        sentence_id = tree.sentence_id if tree is not None else str(i)
        if limit is not None and n > limit:
            if on_long == "error":
                raise InputError(f"sentence {sentence_id} has {n} tokens but the model takes at "
                                 f"most {limit}; shorten it or pass on_long='skip' "
                                 "(CLI: --skip-long)")
            skipped.append(sentence_id)
            continue
        text = texts[i] if texts is not None else None
        items.append(_Item(i, sentence_id, text, tree, n))
    if not items:
        raise InputError(f"every sentence was skipped as too long ({len(skipped)})")
    return items, tuple(skipped)


def _batches(items: list[_Item], batch_size: int) -> list[list[_Item]]:
    """Sentences sorted by length, so a batch holds similar lengths and little padding."""
    if batch_size < 1:
        raise InputError(f"batch_size must be positive; got {batch_size}")
    ordered = sorted(items, key=lambda it: (it.n_tokens, it.index))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def _main_self(batches: list[BatchPatterns]) -> BatchPatterns:
    return next(b for b in batches if b.kind == "self")


def _stacked_sums(patterns: BatchPatterns, reducers: list[Reducer]) -> StackedSums:
    """Every layer of one batch through the reducers in one go (a few large tensor
    operations instead of many small ones per layer); same sums as streaming."""
    pattern = patterns.pattern  # [batch, layer, head, q, k]
    n_batch, n_layers, n_heads, q_len, k_len = pattern.shape
    # keys any head of the first layer gave weight to: what the mask let each row see
    seen = (pattern[:, 0] > 0).any(1) & patterns.key_valid[:, None, :]
    block = RowBlock(pattern=pattern.reshape(n_batch, n_layers * n_heads, q_len, k_len),
                     query_valid=patterns.query_valid, query_pos=positions(patterns.query_valid),
                     key_pos=positions(patterns.key_valid),
                     key_len=patterns.key_valid.sum(-1).clamp(min=1), visible=seen.sum(-1),
                     query_ids=patterns.query_ids, key_ids=patterns.key_ids)
    sums: dict[str, Any] = {}
    for reducer in reducers:
        sums.update(reducer(block))
    return StackedSums(patterns.stack, patterns.kind, patterns.layers, patterns.heads,
                       float(patterns.query_valid.sum()), sums)


def _run_batch(model: nn.Module, tokenizer: Any, items: list[_Item], reducers: list,
               similarity: bool, similarity_rows: int | None, from_agg: str) -> CensusPart:
    batch, token_word = _encode(tokenizer, items)
    keep = similarity or token_word is not None
    with torch.no_grad(), capture(model, keep=keep, reducers=None if keep else reducers,
                                  stop_early=True) as cap:
        model(**_model_inputs(model, batch))  # stops after the last attention layer
    part = CensusPart(tally=cap.tally, sentences=len(items))
    if not keep:
        return part
    groups = cap.batches()
    part.stacked = {(g.stack, g.kind): _stacked_sums(g, reducers) for g in groups}
    patterns = _main_self(groups)
    if similarity:
        part.distances = HeadDistances.from_batch(patterns, max_rows=similarity_rows)
    if token_word is not None:
        trees = [it.tree for it in items]
        n_words = max(len(t.words) for t in trees)
        word_pattern = to_words(patterns.pattern.to(torch.float32), token_word, n_words,
                                from_agg=from_agg)
        word_mask = torch.arange(n_words)[None, :] < torch.tensor([len(t) for t in trees])[:, None]
        part.syntax = score_batch(word_pattern, word_mask, trees, layers=patterns.layers,
                                  heads=patterns.heads, stack=patterns.stack, kind=patterns.kind)
    return part


def _gather(parts: list[tuple[int, CensusPart]]) -> list[tuple[int, CensusPart]]:
    """Every rank's parts on every rank (torch.distributed, any backend with objects)."""
    dist = torch.distributed
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, parts)
    return [p for rank_parts in gathered for p in rank_parts]


def census(model: nn.Module, tokenizer: Any, texts: Sequence[str] | None = None, *,
           trees: Sequence[Tree] | None = None, syntax: bool | None = None,
           similarity: bool = True, similarity_rows: int | None = 16,
           repeated: bool = True, batch_size: int = 32,
           max_length: int | None = None, on_long: str = "error", window: int = 3,
           min_count: int = 20, from_agg: str = "mean", nlp: Any = None,
           distributed: bool | None = None, progress: bool = False) -> Census:
    """Score every head of ``model`` over a corpus.

    Args:
        texts / trees: raw sentences, or dependency trees (e.g. from
            :func:`~attnprobe.heads.trees.read_conllu`) whose words are fed pre-split. A
            text with a tab is a sentence pair (the ``block`` score needs pairs).
        syntax: parse ``texts`` with spaCy (``nlp`` or the packaged English pipeline) to
            score heads against dependency relations; default: only when trees are given.
        similarity: accumulate Jensen–Shannon distances between heads (keeps each batch's
            weights briefly; switch off for very long inputs).
        similarity_rows: query rows per batch used for the distances, evenly spaced over
            the batch (their cost is heads² × rows × keys); ``None``: every row.
        repeated: also run the repeated-random-token probe (``rep_*`` scores).
        on_long: ``"error"`` (default) names the first sentence longer than the model allows;
            ``"skip"`` leaves such sentences out and lists them in ``Census.skipped``.
        distributed: split batches across the ranks of an initialised ``torch.distributed``
            process group and all-gather the parts (default: when a group is initialised).
        progress: show a progress bar over batches (tqdm).

    Returns:
        A :class:`Census`; ``.scores()``, ``.classify()``, ``.syntax()``, ``.layer_profile()``,
        ``.distances()`` give tidy tables.
    """
    if (texts is None) == (trees is None):
        raise InputError("give texts or trees (not both)")
    if texts is not None:
        texts = check_texts(texts)
        if syntax:
            trees, texts = parse(texts, nlp=nlp), None
    elif syntax is False:
        raise InputError("trees were given but syntax=False; pass texts instead")
    trees = list(trees) if trees is not None else None
    if trees is not None and not trees:
        raise InputError("no trees given")
    items, skipped = _items(model, tokenizer, texts, trees, max_length, on_long)
    classes = token_classes(tokenizer)
    reducers = census_reducers(classes=classes)
    dist = torch.distributed
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    batches = list(enumerate(_batches(items, batch_size)))[rank::world]
    if progress:
        from attnprobe._optional import require

        batches = require("tqdm").tqdm(batches, desc="census", unit="batch",
                                       disable=rank != 0)
    parts = [(i, _run_batch(model, tokenizer, group, reducers, similarity, similarity_rows,
                            from_agg)) for i, group in batches]
    if distributed:
        parts = _gather(parts)
    merged = CensusPart()
    for _, part in sorted(parts, key=lambda p: p[0]):  # the same order on every rank count
        merged = merged + part
    probe = repeated_token_scores(model, tokenizer, classes=classes) if repeated else None
    return Census(merged, skipped, window, min_count, probe)
