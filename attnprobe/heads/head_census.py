"""The head census: every per-head score over a corpus, streamed batch by batch.

:func:`census` runs the model once per batch inside one :func:`~attnprobe.capture.capture`
for the whole corpus; its part (:class:`~attnprobe.heads.census_tap.CensusTap`) reduces the
weights as they are computed (entropy, offsets, sinks, token classes, token matches,
segments) and keeps only the rows the head distances (Jensen–Shannon) read; when trees are
given (or parsed) the batch's padded weights are also turned into word-level maps and scored
against the dependency relations. Each batch yields mergeable sums; they are added in
batch order, so a run split across processes (``torch.distributed``) gives the same numbers
as one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture.calls import BatchPatterns, StopForward
from attnprobe.capture.context import capture
from attnprobe.capture.info import model_info, model_scope
from attnprobe.core import html_view
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.display import counted, describe
from attnprobe.core.distributed import run_sharded
from attnprobe.core.reducers import Tally
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.heads import labels
from attnprobe.heads.census_batches import CensusBatch, plan_batches
from attnprobe.heads.census_options import CensusOptions
from attnprobe.heads.census_sums import CensusSums
from attnprobe.heads.census_tap import CensusTap
from attnprobe.heads.dependencies import MIN_COUNT, SyntaxCounts, score_batch
from attnprobe.heads.probe import limits_within, probe_tally, probe_vocabulary, repeated_tokens
from attnprobe.heads.probe import probe_length as resolve_probe_length
from attnprobe.heads.scores import (
    INDEX,
    census_reducers,
    offset_table,
    wide_scores,
)
from attnprobe.heads.similarity import cluster_heads
from attnprobe.heads.trees import Tree, texts_or_trees
from attnprobe.heads.words import to_words
from attnprobe.inputs.prepared import PreparedCorpus, facts_of, prepared_with
from attnprobe.inputs.text import Text


@dataclass
class Census:
    """Census results. Tables are computed from the merged sums on request.

    Attributes:
        sums: merged sums (tally of streaming statistics, syntax counts, head distances).
        skipped: ids of sentences left out because they were too long (``truncation="skip"``).
        window: offsets ±window get their own score column.
        probe: the repeated-random-token probe's tally (``rep_*`` scores), kept apart from
            the corpus sums so its rows never dilute corpus means.
        probe_length: tokens per copy of the probe (None without the probe).
    """

    sums: CensusSums
    skipped: tuple[str, ...] = ()
    window: int = 3
    min_count: int = MIN_COUNT
    probe: Tally | None = None
    scope: Scope = field(default_factory=Scope)
    probe_length: int | None = None
    model: str = ""  # the model's name (ModelInfo.name), shown by repr

    @property
    def n_sentences(self) -> int:
        return self.sums.sentences

    def __repr__(self) -> str:
        heads, layers, rows = self.sums.shape()
        syntax = self.sums.syntax
        return describe(
            "Census", f"{self.model + ': ' if self.model else ''}{counted(heads, 'head')} in "
            f"{counted(layers, 'layer')}", counted(self.n_sentences, "sentence"),
            counted(rows, "token"),
            None if syntax is None else f"syntax on {counted(syntax.scored_words, 'word')}",
            "head distances" if self.sums.distances is not None else None,
            None if self.probe is None else f"repeated-token probe of {self.probe_length}",
            f"{counted(len(self.skipped), 'sentence')} skipped" if self.skipped else None,
            None if self.scope.is_all else f"scope {str(self.scope)[:40]}")

    def _repr_html_(self) -> str | None:
        """Head grid by label and the label table in a notebook (:mod:`attnprobe.report`)."""
        return html_view.html(self, "census")

    @property
    def tally(self) -> Tally:
        """Every streaming statistic, per (stack, kind, layer) and head (mergeable)."""
        return self.sums.full_tally()

    def scores(self) -> pd.DataFrame:
        """One row per head, every score (columns in ``attnprobe.heads.scores``)."""
        extras = []
        if self.sums.syntax is not None:
            extras.append(self.sums.syntax.per_head(self.min_count))
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

    def syntax(self, min_count: int | None = None) -> pd.DataFrame:
        """Best head per relation vs the best fixed-offset baseline (Clark et al. Table 1):
        relations with at least ``min_count`` words (default: the census's ``min_count``,
        :data:`MIN_COUNT` = 20, as the labels use), plus ``all``."""
        if self.sums.syntax is None:
            raise InputError("this census had no dependency trees; pass trees= or syntax=True")
        return self.sums.syntax.table(self.min_count if min_count is None else min_count)

    def offsets(self) -> pd.DataFrame:
        """Mass and argmax share at every relative offset, per head (long form)."""
        return offset_table(self.tally)

    def distances(self) -> pd.DataFrame:
        """Mean Jensen–Shannon divergence between every pair of heads (long form)."""
        if self.sums.distances is None:
            raise InputError("head distances were not computed (similarity=False)")
        return self.sums.distances.to_frame()

    def clusters(self, n_clusters: int = 6) -> pd.DataFrame:
        """Heads grouped by their JS distances, with 2-D MDS coordinates."""
        if self.sums.distances is None:
            raise InputError("head distances were not computed (similarity=False)")
        return cluster_heads(self.sums.distances, n_clusters)


@dataclass(frozen=True)
class _Run:
    """What every batch of one census shares."""

    model: nn.Module
    tap: CensusTap
    from_agg: str


def _syntax(run: _Run, items: Sequence[Any], patterns: BatchPatterns,
            token_word: torch.Tensor) -> SyntaxCounts:
    """The batch's word-level weights scored against its trees."""
    trees = [it.tree for it in items]
    n_words = max(len(t.words) for t in trees)
    word_pattern = to_words(patterns.pattern.to(torch.float32), token_word, n_words,
                            from_agg=run.from_agg)
    word_mask = torch.arange(n_words)[None, :] < torch.tensor([len(t) for t in trees])[:, None]
    return score_batch(word_pattern, word_mask, trees, layers=patterns.layers,
                       heads=patterns.heads, stack=patterns.stack, kind=patterns.kind)


def _run_batch(run: _Run, group: CensusBatch) -> CensusSums:
    """One forward inside the corpus' capture; what the tap kept of it."""
    inputs, token_word = group.inputs()
    try:
        run.model(**inputs)
    except StopForward:  # after the last attention layer: the rest is not needed
        pass
    sums, main = run.tap.take(len(group.sentences))
    if token_word is not None and main is not None:
        sums.syntax = _syntax(run, group.sentences, main, token_word)
    return sums


def census(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | None = None, *,
           trees: Sequence[Tree] | None = None, options: CensusOptions | None = None,
           corpus: CorpusOptions | None = None, **keywords: Any) -> Census:
    """Score every head of ``model`` over a corpus.

    Args:
        texts / trees: raw sentences, or dependency trees (e.g. from
            :func:`~attnprobe.heads.trees.read_conllu`) whose words are fed pre-split. A
            text with a tab is a sentence pair (the ``block`` score needs pairs).
            ``texts`` may be a :class:`~attnprobe.inputs.prepared.PreparedCorpus`: its
            token rows, length limit and token classes are read, not computed again.
        options: what the census computes (:class:`~attnprobe.heads.census_options.
            CensusOptions`: syntax, head distances, the repeated-token probe, offsets ...).
        corpus: how the corpus is walked (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`): ``scope`` (which heads; default every head), ``batch_size``
            (sentences per forward, sorted by length first), ``max_length``,
            ``truncation`` (sentences longer than the model allows: ``"error"`` names the
            first, ``"skip"`` leaves them out, listed in ``Census.skipped``, ``"cut"`` cuts
            raw texts; parsed sentences cannot be cut), ``seed`` (the repeated-token
            probe), ``progress``, ``distributed`` (split batches across the ranks of an
            initialised ``torch.distributed`` group).
        keywords: any corpus or census option by name, e.g. ``batch_size=8``,
            ``similarity=False`` (they replace the fields of ``corpus`` / ``options``).

    Returns:
        A :class:`Census`; ``.scores()``, ``.classify()``, ``.syntax()``, ``.layer_profile()``,
        ``.distances()`` give tidy tables.

    Example:
        >>> c = census(lm, lm_tok, [prompt])            # 2 layers × 4 heads, probe included
        >>> scores = c.scores()                         # one row per head, every score
        >>> len(scores), "rep_induction" in scores.columns
        (8, True)
        >>> c.classify()[["head_id", "label", "evidence"]]
    """
    if (texts is None) == (trees is None):
        raise InputError("give texts or trees (not both)")
    given, own = CorpusOptions.split(keywords)
    walk = CorpusOptions.merged(corpus, given, owner="census()")
    opts = (options or CensusOptions()).with_keywords(own)
    truncation = walk.truncation_mode
    scope = model_scope(model, walk.scope)
    facts = facts_of(model, tokenizer, texts)
    classes = facts.classes
    limits = limits_within(model, facts.max_length)
    probe_length = vocabulary = None
    if opts.repeated:  # checked before any forward: a bad length fails fast
        vocabulary = probe_vocabulary(tokenizer, classes)
        probe_length = resolve_probe_length(tokenizer, opts.probe_length, classes=classes,
                                            max_length=limits.positions,
                                            trained_length=limits.trained,
                                            vocabulary=vocabulary)
    given_texts = texts
    texts, trees = texts_or_trees(texts, trees, opts.syntax, opts.nlp)
    if isinstance(trees, (str, Tree)):
        raise InputError("trees must be a list of Tree objects; wrap a single tree in a list")
    trees = list(trees) if trees is not None else None
    if trees is not None and not trees:
        raise InputError("no trees given")
    wrong = next((i for i, tree in enumerate(trees or ()) if not isinstance(tree, Tree)), None)
    if wrong is not None:
        raise InputError(f"trees[{wrong}] is a {type(trees[wrong]).__name__}, not a Tree "
                         "(read_conllu or parse make them; raw sentences go in texts)")
    if texts is not None:  # the caller's prepared corpus keeps what it already computed
        texts = prepared_with(facts, given_texts if isinstance(given_texts, PreparedCorpus)
                              else texts)
    batches, skipped = plan_batches(model, tokenizer, texts, trees=trees,
                                    batch_size=walk.batch(), truncation=truncation,
                                    max_length=walk.max_length, facts=facts)
    reducers = census_reducers(classes=classes, max_offset=opts.max_offset)
    # one capture for the corpus: each batch's forward is read by the tap and dropped
    tap = CensusTap(reducers, sample_rows=opts.similarity_rows if opts.similarity else 0,
                    keep_main=trees is not None)
    with torch.no_grad(), capture(model, scope, parts=[tap], stop_early=True):
        per_batch = run_sharded(partial(_run_batch, _Run(model, tap, opts.from_agg)), batches,
                            distributed=walk.distributed, progress=walk.progress,
                            desc="census")
    merged = CensusSums()
    for batch_sums in per_batch:  # in batch order, whatever the number of ranks
        merged = merged + batch_sums
    probe = probe_tally(model, repeated_tokens(tokenizer, length=probe_length, seed=walk.seed,
                                               max_length=limits.positions, classes=classes,
                                               vocabulary=vocabulary),
                        classes=classes, scope=scope) if opts.repeated else None
    return Census(merged, skipped, opts.window, opts.min_count, probe, scope, probe_length,
                  model=model_info(model, implementation="").name)
