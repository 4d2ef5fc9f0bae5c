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
from functools import partial
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture.calls import BatchPatterns, positions
from attnprobe.capture.context import capture
from attnprobe.capture.info import model_info, model_scope
from attnprobe.capture.text import (
    DEFAULT_BATCH_SIZE,
    Truncation,
    truncation_mode,
)
from attnprobe.core import html_view
from attnprobe.core.display import counted, describe, grid
from attnprobe.core.distributed import run_sharded
from attnprobe.core.reducers import Reducer, RowBlock, Tally
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.core.tokens import token_classes
from attnprobe.errors import InputError
from attnprobe.heads import labels
from attnprobe.heads.census_batches import CensusBatch, plan_batches
from attnprobe.heads.dependencies import SyntaxCounts, score_batch
from attnprobe.heads.probe import probe_length as resolve_probe_length
from attnprobe.heads.probe import probe_limits, probe_tally, repeated_tokens
from attnprobe.heads.scores import (
    DEFAULT_MAX_OFFSET,
    INDEX,
    census_reducers,
    offset_table,
    wide_scores,
)
from attnprobe.heads.similarity import HeadDistances, cluster_heads
from attnprobe.heads.trees import Tree, texts_or_trees
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

    def __repr__(self) -> str:
        return describe("StackedSums", f"{self.stack} {self.kind}",
                        grid(self.layers, self.heads), counted(len(self.sums), "statistic"),
                        counted(self.rows, "row"))

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

    def shape(self) -> tuple[int, int, float]:
        """``(heads, layers, rows)`` summed over: every (stack, kind, layer, head) site, the
        distinct layers, and the most query rows any layer saw (the corpus' tokens)."""
        heads = {(*site, h) for site, hs in self.tally.heads.items() for h in hs}
        heads |= {(s.stack, s.kind, layer, h) for s in self.stacked.values()
                  for layer in s.layers for h in s.heads}
        rows = [*self.tally.counts.values(), *(s.rows for s in self.stacked.values()), 0.0]
        return len(heads), len({h[2] for h in heads}), max(rows)

    def __repr__(self) -> str:
        heads, layers, rows = self.shape()
        return describe("CensusPart", counted(self.sentences, "sentence"), counted(rows, "row"),
                        f"{counted(heads, 'head')} in {counted(layers, 'layer')}",
                        "syntax" if self.syntax is not None else None,
                        "head distances" if self.distances is not None else None)

    def full_tally(self) -> Tally:
        """Streaming and stacked sums together, per (stack, kind, layer)."""
        return sum((s.to_tally() for s in self.stacked.values()), self.tally)


@dataclass
class Census:
    """Census results. Tables are computed from the merged sums on request.

    Attributes:
        part: merged sums (tally of streaming statistics, syntax counts, head distances).
        skipped: ids of sentences left out because they were too long (``truncation="skip"``).
        window: offsets ±window get their own score column.
        probe: the repeated-random-token probe's tally (``rep_*`` scores), kept apart from
            the corpus sums so its rows never dilute corpus means.
        probe_length: tokens per copy of the probe (None without the probe).
    """

    part: CensusPart
    skipped: tuple[str, ...] = ()
    window: int = 3
    min_count: int = 20
    probe: Tally | None = None
    scope: Scope = field(default_factory=Scope)
    probe_length: int | None = None
    model: str = ""  # the model's name (ModelInfo.name), shown by repr

    @property
    def n_sentences(self) -> int:
        return self.part.sentences

    def __repr__(self) -> str:
        heads, layers, rows = self.part.shape()
        syntax = self.part.syntax
        return describe(
            "Census", f"{self.model + ': ' if self.model else ''}{counted(heads, 'head')} in "
            f"{counted(layers, 'layer')}", counted(self.n_sentences, "sentence"),
            counted(rows, "token"),
            None if syntax is None else f"syntax on {counted(syntax.scored_words, 'word')}",
            "head distances" if self.part.distances is not None else None,
            None if self.probe is None else f"repeated-token probe of {self.probe_length}",
            f"{counted(len(self.skipped), 'sentence')} skipped" if self.skipped else None,
            None if self.scope.is_all else f"scope {str(self.scope)[:40]}")

    def _repr_html_(self) -> str | None:
        """Head grid by label and the label table in a notebook (:mod:`attnprobe.report`)."""
        return html_view.html(self, "census")

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
        table = wide_scores(self.tally, window=self.window, extra=extra)
        if self.scope.is_grid or table.empty:
            return table
        inside = [self.scope.contains(layer, head) for layer, head in
                  zip(table["layer"], table["head"], strict=True)]
        return table[inside].reset_index(drop=True)

    def classify(self, thresholds: labels.Thresholds | None = None) -> pd.DataFrame:
        """Scores plus ``label``, ``family``, ``evidence`` and ``also`` per head
        (:func:`~attnprobe.heads.labels.classify_scores`)."""
        return labels.classify_scores(self.scores(), thresholds)

    def layer_profile(self, thresholds: labels.Thresholds | None = None
                      ) -> pd.DataFrame:
        """Label and family shares and mean scores per layer
        (:func:`~attnprobe.heads.labels.layer_profile`)."""
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
                     query_ids=patterns.query_ids, key_ids=patterns.key_ids,
                     learned_sink=patterns.learned_sink)
    sums: dict[str, Any] = {}
    for reducer in reducers:
        sums.update(reducer(block))
    return StackedSums(patterns.stack, patterns.kind, patterns.layers, patterns.heads,
                       float(patterns.query_valid.sum()), sums)


@dataclass(frozen=True)
class _Run:
    """What every batch of one census shares."""

    model: nn.Module
    scope: Scope
    reducers: list
    similarity: bool
    similarity_rows: int | None
    from_agg: str


def _run_batch(run: _Run, group: CensusBatch) -> CensusPart:
    model = run.model
    items = group.sentences
    inputs, token_word = group.inputs()
    keep = run.similarity or token_word is not None
    with torch.no_grad(), capture(model, run.scope, keep=keep,
                                  reducers=None if keep else run.reducers,
                                  stop_early=True) as cap:
        model(**inputs)  # stops after the last attention layer
    part = CensusPart(tally=cap.tally, sentences=len(items))
    if not keep:
        return part
    groups = cap.batches()
    part.stacked = {(g.stack, g.kind): _stacked_sums(g, run.reducers) for g in groups}
    patterns = _main_self(groups)
    if run.similarity:
        part.distances = HeadDistances.from_batch(patterns, max_rows=run.similarity_rows)
    if token_word is not None:
        trees = [it.tree for it in items]
        n_words = max(len(t.words) for t in trees)
        word_pattern = to_words(patterns.pattern.to(torch.float32), token_word, n_words,
                                from_agg=run.from_agg)
        word_mask = torch.arange(n_words)[None, :] < torch.tensor([len(t) for t in trees])[:, None]
        part.syntax = score_batch(word_pattern, word_mask, trees, layers=patterns.layers,
                                  heads=patterns.heads, stack=patterns.stack, kind=patterns.kind)
    return part


def census(model: nn.Module, tokenizer: Any, texts: Sequence[str] | None = None, *,
           trees: Sequence[Tree] | None = None, scope: ScopeLike = "all",
           batch_size: int = DEFAULT_BATCH_SIZE, truncation: Truncation = "error",
           seed: int = 0, progress: bool = False, syntax: bool | None = None,
           similarity: bool = True, similarity_rows: int | None = 16, repeated: bool = True,
           probe_length: int | None = None, max_length: int | None = None, window: int = 3,
           min_count: int = 20, from_agg: str = "mean", nlp: Any = None,
           distributed: bool | None = None,
           max_offset: int | None = DEFAULT_MAX_OFFSET) -> Census:
    """Score every head of ``model`` over a corpus.

    Args:
        texts / trees: raw sentences, or dependency trees (e.g. from
            :func:`~attnprobe.heads.trees.read_conllu`) whose words are fed pre-split. A
            text with a tab is a sentence pair (the ``block`` score needs pairs).
        scope: which heads to score (:mod:`attnprobe.core.scope`; default every head).
        batch_size: sentences per forward (sorted by length first).
        truncation: sentences longer than the model allows: ``"error"`` names the first,
            ``"skip"`` leaves them out (listed in ``Census.skipped``), ``"cut"`` cuts raw
            texts (parsed sentences cannot be cut).
        seed: seeds the repeated-random-token probe.
        progress: show a progress bar over batches (tqdm).
        syntax: parse ``texts`` with spaCy (``nlp`` or the packaged English pipeline) to
            score heads against dependency relations; default: only when trees are given.
        similarity: accumulate Jensen–Shannon distances between heads (keeps each batch's
            weights briefly; switch off for very long inputs).
        similarity_rows: query rows per batch used for the distances, evenly spaced over
            the batch (their cost is heads² × rows × keys); ``None``: every row.
        repeated: also run the repeated-random-token probe (``rep_*`` scores), built
            through the tokenizer's own template (``[CLS] x x [SEP]``, ``<s> x x`` ...).
        probe_length: tokens per copy of the probe. Default: what fits the context the
            model was trained on, ``(limit - template) // 2``, at most 32 and the tokenizer's
            ordinary tokens; the limit is ``model.trained_length`` where the model gives it
            (``ref:induction``: 48, so 23), else its positions (``max_position_embeddings``,
            the tokenizer's ``model_max_length``). A longer length is a warning naming the
            limit; one the model's positions cannot hold is an error.
        distributed: split batches across the ranks of an initialised ``torch.distributed``
            process group and all-gather the parts (default: when a group is initialised).
        max_offset: relative offsets beyond ±max_offset (default 64) share one ``far`` bin
            in ``.offsets()`` and the argmax (``pos_*``) statistics; sentences of up to 65
            tokens keep every offset. ``None`` keeps a bin per offset (on long inputs every
            block of rows then costs O(length) statistics).

    Returns:
        A :class:`Census`; ``.scores()``, ``.classify()``, ``.syntax()``, ``.layer_profile()``,
        ``.distances()`` give tidy tables.
    """
    if (texts is None) == (trees is None):
        raise InputError("give texts or trees (not both)")
    if similarity_rows is not None and (isinstance(similarity_rows, bool)
                                        or not isinstance(similarity_rows, int)
                                        or similarity_rows < 1):
        raise InputError(f"similarity_rows must be a positive integer or None (every row); "
                         f"got {similarity_rows!r}")
    if max_offset is not None and (isinstance(max_offset, bool) or not isinstance(max_offset, int)
                                   or max_offset < 1):
        raise InputError(f"max_offset must be a positive integer or None (every offset); "
                         f"got {max_offset!r}")
    truncation = truncation_mode(truncation)
    scope = model_scope(model, scope)
    classes = token_classes(tokenizer)
    limits = probe_limits(model, tokenizer)
    if repeated:  # checked before any forward: a bad length fails fast
        probe_length = resolve_probe_length(tokenizer, probe_length, classes=classes,
                                            max_length=limits.positions,
                                            trained_length=limits.trained)
    elif probe_length is not None:
        raise InputError("probe_length needs the repeated-token probe; drop repeated=False")
    texts, trees = texts_or_trees(texts, trees, syntax, nlp)
    if isinstance(trees, (str, Tree)):
        raise InputError("trees must be a list of Tree objects; wrap a single tree in a list")
    trees = list(trees) if trees is not None else None
    if trees is not None and not trees:
        raise InputError("no trees given")
    wrong = next((i for i, tree in enumerate(trees or ()) if not isinstance(tree, Tree)), None)
    if wrong is not None:
        raise InputError(f"trees[{wrong}] is a {type(trees[wrong]).__name__}, not a Tree "
                         "(read_conllu or parse make them; raw sentences go in texts)")
    batches, skipped = plan_batches(model, tokenizer, texts, trees=trees, batch_size=batch_size,
                                    truncation=truncation, max_length=max_length)
    reducers = census_reducers(classes=classes, max_offset=max_offset)
    run = _Run(model, scope, reducers, similarity, similarity_rows, from_agg)
    parts = run_sharded(partial(_run_batch, run), batches,
                        distributed=distributed, progress=progress, desc="census")
    merged = CensusPart()
    for part in parts:  # in batch order, whatever the number of ranks
        merged = merged + part
    probe = probe_tally(model, repeated_tokens(tokenizer, length=probe_length, seed=seed,
                                               max_length=limits.positions, classes=classes),
                        classes=classes, scope=scope) if repeated else None
    return Census(merged, skipped, window, min_count, probe, scope, probe_length,
                  model=model_info(model, implementation="").name)
