"""Which heads track which dependency relations (Clark et al. 2019 §4; Vig & Belinkov 2019).

For a head's word-level attention ``M`` over one sentence (self-attention zeroed out):

- ``dep->head``: the predicted head of word ``i`` is ``argmax_j M[i, j]`` (the dependent
  attends to its head);
- ``head->dep``: the predicted head of ``i`` is ``argmax_j M[j, i]`` (the word that attends
  most to ``i``).

Accuracy for relation ``r`` is the fraction of words labelled ``r`` whose predicted head is
their gold head; ``all`` is the same over every non-root word (UAS). Root words are skipped;
``punct`` is scored like any other relation. The fixed-offset baseline predicts head
``i + offset`` (0-based over words; out of range is wrong) and keeps the best offset per
relation. Clark's poss/``'s`` special case is not applied (in UD, ``'s`` is a word of its own).

Dependency alignment (Vig & Belinkov §4): per head, the attention mass on word pairs
``(i, j)`` joined by a dependency edge in either direction divided by the total attention
mass, both summed over all sentences and **excluding the diagonal** (self-attention is never
a relation, and Clark ignores it too). Special tokens are excluded because the maps are over
words only.

:class:`SyntaxCounts` holds integer counts and float sums, so ``a + b`` merges batches exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from attnprobe.core.display import counted, describe
from attnprobe.core.merging import Summable
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError
from attnprobe.heads.trees import Tree
from attnprobe.heads.words import FROM_AGGS, align_tokens, to_words
from attnprobe.types import AttentionMap, head_id

DEFAULT_OFFSETS = (-3, -2, -1, 1, 2, 3)
# words a relation needs before a table lists it or a label rests on it: an accuracy over
# fewer words is mostly noise (the census, its syntax table, the labels and the report agree)
MIN_COUNT = 20
DIRECTIONS = ("dep->head", "head->dep")
ALL = "all"
TABLE_COLUMNS = ("relation", "count", "direction", "stack", "kind", "layer", "head", "head_id",
                 "accuracy", "baseline", "baseline_offset", "margin")
PER_HEAD_COLUMNS = ("stack", "kind", "layer", "head", "syntax_relation", "syntax_direction",
                    "syntax_accuracy", "syntax_baseline", "syntax_margin", "syntax_count",
                    "dep_alignment")

Group = tuple[str, str]  # (stack, kind)


def _add(store: dict, key: object, value: torch.Tensor) -> None:
    store[key] = store[key] + value if key in store else value


@dataclass
class SyntaxCounts(Summable):
    """Mergeable counts for scoring heads against dependency trees.

    Attributes (keys hold the ``(stack, kind)`` group):
        offsets: baseline offsets.
        grids: ``group -> (layers, heads)``, the model indices of the count tensors' axes.
        words: ``(group, relation) -> number of words`` with that relation.
        correct: ``(group, relation, direction) -> int64 [layer, head]`` correct predictions.
        baseline: ``(group, relation) -> int64 [offset]`` correct fixed-offset predictions.
        related: ``group -> float64 [layer, head]`` attention on related word pairs.
        mass: ``group -> float64 [layer, head]`` attention on all word pairs (no diagonal).
    """

    offsets: tuple[int, ...] = DEFAULT_OFFSETS
    grids: dict[Group, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    words: dict[tuple[Group, str], int] = field(default_factory=dict)
    correct: dict[tuple[Group, str, str], torch.Tensor] = field(default_factory=dict)
    baseline: dict[tuple[Group, str], torch.Tensor] = field(default_factory=dict)
    related: dict[Group, torch.Tensor] = field(default_factory=dict)
    mass: dict[Group, torch.Tensor] = field(default_factory=dict)

    def __repr__(self) -> str:
        return describe("SyntaxCounts", counted(sum(len(layers) * len(heads) for layers, heads
                                                    in self.grids.values()), "head"),
                        f"{counted(self.scored_words, 'word')} with a head",
                        counted(len({r for _, r in self.words} - {ALL}), "relation"),
                        f"offset baselines {', '.join(f'{o:+d}' for o in self.offsets)}")

    @property
    def scored_words(self) -> int:
        """Words scored (those with a head word; the most of any attention group)."""
        return max((n for (_, name), n in self.words.items() if name == ALL), default=0)

    # ------------------------------------------------------------------------- merging
    def __add__(self, other: SyntaxCounts) -> SyntaxCounts:
        if not isinstance(other, SyntaxCounts):
            return NotImplemented
        if other.offsets != self.offsets:
            raise InputError(f"cannot merge counts with offsets {self.offsets} and "
                             f"{other.offsets}")
        merged = SyntaxCounts(self.offsets, dict(self.grids), dict(self.words),
                              dict(self.correct), dict(self.baseline), dict(self.related),
                              dict(self.mass))
        for group, grid in other.grids.items():
            if merged.grids.setdefault(group, grid) != grid:
                raise InputError(f"cannot merge counts with different layers/heads for {group}")
        for key, count in other.words.items():
            merged.words[key] = merged.words.get(key, 0) + count
        for store, theirs in ((merged.correct, other.correct), (merged.baseline, other.baseline),
                              (merged.related, other.related), (merged.mass, other.mass)):
            for key, value in theirs.items():
                _add(store, key, value)
        return merged

    # ------------------------------------------------------------------------- scoring
    def _add_batch(self, group: Group, pattern: torch.Tensor, mask: torch.Tensor,
                   trees: Sequence[Tree]) -> None:
        """Count a batch of sentences at once.

        ``pattern`` ``[batch, layer, head, word, word]`` holds each sentence's words first
        (``mask`` ``[batch, word]`` True on them); the rest is ignored.
        """
        batch, _, _, n, _ = pattern.shape
        labels = [[r if h > 0 and r != "root" else None
                   for h, r in zip(tree.heads, tree.relations, strict=True)] for tree in trees]
        names = [ALL, *dict.fromkeys(r for row in labels for r in row if r is not None)]
        index = {name: k for k, name in enumerate(names)}
        pad = [[-1] * (n - len(tree)) for tree in trees]
        gold = torch.tensor([[h - 1 for h in tree.heads] + rest  # 0-based gold head, -1: none
                             for tree, rest in zip(trees, pad, strict=True)], dtype=torch.long)
        relation = torch.tensor([[-1 if r is None else index[r] for r in row] + rest
                                 for row, rest in zip(labels, pad, strict=True)],
                                dtype=torch.long)
        scored = relation >= 0  # has a head and is not labelled root
        member = (relation[None] == torch.arange(len(names))[:, None, None]) & scored  # [r,b,w]
        member[0] = scored  # "all": every scored word
        for name, count in zip(names, member.sum((1, 2)).tolist(), strict=True):
            self.words[(group, name)] = self.words.get((group, name), 0) + count
        eye = torch.eye(n, dtype=torch.bool)
        closed = eye | ~mask[:, None, :] | ~mask[:, :, None]  # [batch, word, word]
        masked = pattern.masked_fill(closed[:, None, None].to(pattern.device), -math.inf)
        # max(...).indices: much faster than argmax on CPU, above all along dim -2
        preds = torch.stack([masked.max(-1).indices.cpu(), masked.max(-2).indices.cpu()])
        # [direction, scored word, layer, head]: whether the prediction is the gold head,
        # counted per relation (and for all) by one index_add over the scored words
        hit = (preds == gold[None, :, None, None, :]).permute(0, 1, 4, 2, 3)[:, scored].long()
        per_relation = hit.new_zeros(len(DIRECTIONS), len(names), *hit.shape[2:])
        per_relation.index_add_(1, relation[scored], hit)
        per_relation[:, 0] = hit.sum(1)
        for d, direction in enumerate(DIRECTIONS):
            for k, name in enumerate(names):
                _add(self.correct, (group, name, direction), per_relation[d, k])
        distance = gold - torch.arange(n)  # gold head position relative to the word
        offsets = torch.tensor(self.offsets)
        by_offset = ((distance[None, :, :, None] == offsets) & member[..., None]).sum((1, 2))
        for k, name in enumerate(names):
            _add(self.baseline, (group, name), by_offset[k])
        edges = torch.zeros(batch, n, n, dtype=torch.bool)
        rows, words = torch.nonzero(gold >= 0, as_tuple=True)
        edges[rows, words, gold[rows, words]] = True
        edges = edges | edges.transpose(1, 2)
        # float32 within a batch (at most batch x words² terms per head), float64 across
        pairs = torch.stack([edges & ~closed, ~closed], -1).to(pattern.dtype)  # [b, i, j, 2]
        related, mass = torch.einsum("blhij,bijp->plh", pattern, pairs).to(torch.float64).cpu()
        _add(self.related, group, related)
        _add(self.mass, group, mass)

    # -------------------------------------------------------------------------- tables
    def _relations(self, group: Group, min_count: int, with_all: bool) -> list[str]:
        """Relations of ``group`` with ``count >= min_count``, by count descending."""
        names = [(r, c) for (g, r), c in self.words.items()
                 if g == group and r != ALL and c >= min_count and c > 0]
        names.sort(key=lambda rc: (-rc[1], rc[0]))
        if with_all and self.words.get((group, ALL), 0) > 0:
            names.insert(0, (ALL, self.words[(group, ALL)]))
        return [r for r, _ in names]

    def _scores(self, group: Group, relation: str) -> tuple[torch.Tensor, float, int, int]:
        """``accuracy [direction, layer, head]``, baseline, its offset, and the word count."""
        count = self.words[(group, relation)]
        correct = torch.stack([self.correct[(group, relation, d)] for d in DIRECTIONS])
        accuracy = correct.to(torch.float64) / count
        base = self.baseline[(group, relation)]
        best = int(base.argmax())  # first best offset in ``offsets`` order
        return accuracy, int(base[best]) / count, self.offsets[best], count

    def head_table(self, min_count: int = MIN_COUNT) -> pd.DataFrame:
        """Every (relation, direction, head) in long form, for relations with ``count >=
        min_count`` (:data:`MIN_COUNT`; 1: every relation) and ``all``; columns
        ``TABLE_COLUMNS``."""
        frames = []
        for group in sorted(self.grids):
            layers, heads = self.grids[group]
            grid_l, grid_h = np.meshgrid(layers, heads, indexing="ij")
            ids = [head_id(int(x), int(y)) for x, y in zip(grid_l.ravel(), grid_h.ravel(),
                                                              strict=True)]
            for relation in self._relations(group, min_count, with_all=True):
                accuracy, baseline, offset, count = self._scores(group, relation)
                for d, direction in enumerate(DIRECTIONS):
                    acc = accuracy[d].numpy().ravel()
                    frames.append(pd.DataFrame({
                        "relation": relation, "count": count, "direction": direction,
                        "stack": group[0], "kind": group[1], "layer": grid_l.ravel(),
                        "head": grid_h.ravel(), "head_id": ids, "accuracy": acc,
                        "baseline": baseline, "baseline_offset": offset,
                        "margin": acc - baseline}))
        if not frames:
            return pd.DataFrame(columns=list(TABLE_COLUMNS))
        return pd.concat(frames, ignore_index=True)[list(TABLE_COLUMNS)]

    def table(self, min_count: int = MIN_COUNT) -> pd.DataFrame:
        """The best head per relation (over both directions and all heads), Clark's Table 1.

        One row per ``(stack, kind, relation)`` with ``count >= min_count`` (default
        :data:`MIN_COUNT` words, as the census; 1: every relation), plus ``all``
        (UAS); columns ``TABLE_COLUMNS``; accuracies are fractions in [0, 1];
        ``margin = accuracy - baseline``. Sorted by count, descending. Ties go to the first
        head in (direction, layer, head) order.
        """
        rows = []
        for group in sorted(self.grids):
            layers, heads = self.grids[group]
            for relation in self._relations(group, min_count, with_all=True):
                accuracy, baseline, offset, count = self._scores(group, relation)
                d, li, hi = np.unravel_index(int(accuracy.argmax()), tuple(accuracy.shape))
                best = float(accuracy[d, li, hi])
                rows.append((relation, count, DIRECTIONS[d], group[0], group[1], layers[li],
                             heads[hi], head_id(layers[li], heads[hi]), best, baseline,
                             offset, best - baseline))
        frame = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
        return frame.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)

    def per_head(self, min_count: int = MIN_COUNT, exclude: Sequence[str] = ("punct",)
                 ) -> pd.DataFrame:
        """One row per head: its best relation by margin, and its dependency alignment.

        Among relations other than ``all`` and ``exclude`` (punctuation attaches by
        convention, not syntax; Clark et al.'s Table 1 leaves it out too) with
        ``count >= min_count``, the (relation,
        direction) with the largest ``accuracy - baseline``; relation and direction are None
        and the scores NaN when no relation qualifies. Columns ``PER_HEAD_COLUMNS``.
        """
        frames = []
        for group in sorted(self.grids):
            layers, heads = self.grids[group]
            grid_l, grid_h = np.meshgrid(layers, heads, indexing="ij")
            mass = self.mass[group].numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                alignment = np.where(mass > 0, self.related[group].numpy() / mass, np.nan)
            frame = pd.DataFrame({
                "stack": group[0], "kind": group[1], "layer": grid_l.ravel(),
                "head": grid_h.ravel(), "syntax_relation": None, "syntax_direction": None,
                "syntax_accuracy": np.nan, "syntax_baseline": np.nan, "syntax_margin": np.nan,
                "syntax_count": pd.array([None] * grid_l.size, dtype="Int64"),
                "dep_alignment": alignment.ravel()})
            relations = [r for r in self._relations(group, min_count, with_all=False)
                         if r not in exclude]
            if relations:
                scores = [self._scores(group, r) for r in relations]
                margin = torch.stack([acc - base for acc, base, _, _ in scores])  # [r, d, l, h]
                flat = margin.flatten(0, 1).flatten(1)  # [relation * direction, head]
                best = flat.argmax(0).numpy()
                r_index, d_index = best // len(DIRECTIONS), best % len(DIRECTIONS)
                accuracy = torch.stack([acc for acc, _, _, _ in scores]).flatten(0, 1)
                accuracy = accuracy.flatten(1).numpy()[best, np.arange(flat.shape[1])]
                frame["syntax_relation"] = [relations[r] for r in r_index]
                frame["syntax_direction"] = [DIRECTIONS[d] for d in d_index]
                frame["syntax_accuracy"] = accuracy
                frame["syntax_baseline"] = [scores[r][1] for r in r_index]
                frame["syntax_margin"] = flat.numpy()[best, np.arange(flat.shape[1])]
                frame["syntax_count"] = pd.array([scores[r][3] for r in r_index], dtype="Int64")
            frames.append(frame)
        if not frames:
            return pd.DataFrame(columns=list(PER_HEAD_COLUMNS))
        return pd.concat(frames, ignore_index=True)[list(PER_HEAD_COLUMNS)]


def _check_offsets(offsets: Sequence[int]) -> tuple[int, ...]:
    values = tuple(offsets)
    if not values or len(set(values)) != len(values) or any(
            isinstance(o, bool) or not isinstance(o, int) for o in values):
        raise InputError(f"offsets must be distinct integers; got {offsets}")
    return values


def score_batch(word_pattern: torch.Tensor, word_mask: torch.Tensor, trees: Sequence[Tree], *,
                layers: Sequence[int], heads: Sequence[int], stack: str = "",
                kind: str = "self", offsets: Sequence[int] = DEFAULT_OFFSETS) -> SyntaxCounts:
    """Count how well every head predicts the trees' dependency heads.

    Args:
        word_pattern: ``[batch, layer, head, word, word]`` word-level self-attention (e.g. from
            :func:`~attnprobe.heads.words.to_words`), special tokens already dropped.
        word_mask: ``[batch, word]`` bool, True on the words of each sentence (in order).
        trees: one tree per batch row; row ``b`` must have ``len(trees[b])`` words.
        layers / heads: model indices of dims 1 and 2.
        stack / kind: the attention site, carried into the tables.
        offsets: fixed-offset baseline offsets.

    Returns:
        A :class:`SyntaxCounts`; add counts of other batches with ``+``.
    """
    offsets = _check_offsets(offsets)
    if not isinstance(word_pattern, torch.Tensor) or word_pattern.ndim != 5:
        raise InputError("word_pattern must be a tensor [batch, layer, head, word, word]")
    b, n_l, n_h, n_w, n_w2 = word_pattern.shape
    if b == 0:
        raise InputError("no sentences to score (batch of 0)")
    if n_w != n_w2 or tuple(word_mask.shape) != (b, n_w) or len(trees) != b:
        raise InputError(f"word_pattern {tuple(word_pattern.shape)}, word_mask "
                         f"{tuple(word_mask.shape)} and {len(trees)} trees do not match "
                         "([batch, layer, head, word, word], [batch, word], batch trees)")
    layers, heads = tuple(int(x) for x in layers), tuple(int(x) for x in heads)
    if (len(layers), len(heads)) != (n_l, n_h):
        raise InputError(f"{len(layers)} layers and {len(heads)} heads given for a pattern with "
                         f"{n_l} layers and {n_h} heads")
    counts = SyntaxCounts(offsets)
    group = (stack, kind)
    counts.grids[group] = (layers, heads)
    wrong = next((row for row, tree in enumerate(trees) if not isinstance(tree, Tree)), None)
    if wrong is not None:
        raise InputError(f"trees[{wrong}] must be a Tree; got {type(trees[wrong]).__name__}")
    n_real = word_mask.sum(1)
    first_words = torch.arange(n_w, device=word_mask.device)[None, :] < n_real[:, None]
    bad = (n_real.cpu() != torch.tensor([len(tree) for tree in trees])) | \
        (word_mask.to(torch.bool) != first_words).any(1).cpu()
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise InputError(f"sentence {trees[row].sentence_id}: {int(n_real[row])} words in the "
                         f"mask but {len(trees[row])} in the tree (the mask must mark its "
                         "first words)")
    counts._add_batch(group, word_pattern, word_mask.to(torch.bool).cpu(), trees)
    return counts


def count_syntax(maps: Sequence[AttentionMap], trees: Sequence[Tree], *,
                 from_agg: str = "mean",
                 offsets: Sequence[int] = DEFAULT_OFFSETS) -> SyntaxCounts:
    """:class:`SyntaxCounts` of stored self-attention maps, one map per tree (same order).

    Each map's query tokens are aligned to its tree's words with
    :func:`~attnprobe.heads.words.align_tokens` (no tokenizer needed), pooled to words with
    :func:`~attnprobe.heads.words.to_words` (attention to a word summed over its pieces, from
    a word by ``from_agg``), and scored with :func:`score_batch`.
    """
    if from_agg not in FROM_AGGS:
        raise InputError(one_of("from_agg", from_agg, FROM_AGGS))
    maps, trees = list(maps), list(trees)
    if not maps:
        raise InputError("no attention maps to score")
    if len(maps) != len(trees):
        raise InputError(f"{len(maps)} maps but {len(trees)} trees; give one tree per map")
    parts = []
    for amap, tree in zip(maps, trees, strict=True):
        if not isinstance(amap, AttentionMap) or not isinstance(tree, Tree):
            raise InputError("syntax takes AttentionMap objects and Tree objects")
        if amap.kind != "self" or amap.query_tokens != amap.key_tokens:
            what = ("cross-attention" if amap.kind != "self"
                    else "over different query and key tokens")
            raise InputError(f"sentence {tree.sentence_id}: map {amap.example_id!r} is {what}; "
                             "syntax scores self-attention maps only")
        token_word = align_tokens(amap.query_tokens, tree.words, sentence_id=tree.sentence_id)
        words = to_words(amap.pattern, torch.tensor(token_word), len(tree), from_agg=from_agg)
        parts.append(score_batch(words[None], torch.ones(1, len(tree), dtype=torch.bool),
                                 [tree], layers=amap.layers, heads=amap.heads,
                                 stack=amap.stack, kind=amap.kind, offsets=offsets))
    return sum(parts)


def syntax(maps: Sequence[AttentionMap], trees: Sequence[Tree], *, from_agg: str = "mean",
           offsets: Sequence[int] = DEFAULT_OFFSETS, min_count: int = MIN_COUNT
           ) -> pd.DataFrame:
    """Best head per dependency relation on stored maps (Clark et al. 2019, Table 1).

    Args:
        maps: self-attention maps, ``pattern [layer, head, token, token]``, one per tree.
        trees: gold trees (:func:`~attnprobe.heads.trees.read_conllu` or
            :func:`~attnprobe.heads.trees.parse`), in the same order.
        from_agg: attention from a multi-piece word: ``mean``, ``first`` or ``max``.
        offsets: fixed-offset baseline offsets.
        min_count: leave out relations with fewer words (default :data:`MIN_COUNT` = 20,
            as ``Census.syntax()`` and the labels; 1 lists every relation, however rare).

    Returns:
        :meth:`SyntaxCounts.table`: one row per relation plus ``all``, columns
        ``TABLE_COLUMNS``.

    Example:
        >>> syntax(maps, trees)["relation"].tolist()    # 2 sentences: no relation has 20 words
        ['all']
        >>> table = syntax(maps, trees, min_count=1)    # one gold tree per map, every relation
        >>> table[["relation", "count", "direction", "head_id", "accuracy"]]
        >>> det = table.set_index("relation").loc["det"]     # The cat, the mat, A dog, ...
        >>> int(det["count"]), float(det["baseline"]), int(det["baseline_offset"])
        (4, 1.0, 1)
        >>> int(table.set_index("relation").loc["all", "count"])   # non-root words: 2 × 6
        12
    """
    return count_syntax(maps, trees, from_agg=from_agg, offsets=offsets).table(min_count)
