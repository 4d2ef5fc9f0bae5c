"""What did fine-tuning change? Two checkpoints of one model, head by head, on one corpus.

:func:`diff` runs the head census of both models over the same sentences (the same batches,
encoded once by model A's tokenizer) and both models side by side on those batches
(:mod:`.paired_attention`). The result, a :class:`Diff`, gives

- :meth:`Diff.heads`: one row per head: the label in A and in B and whether it changed, the
  mean Jensen–Shannon divergence between the two models' rows of that head (nats, at most
  ln 2), its largest row, Kovaleva et al.'s cosine similarity of the two maps, and the change
  (B − A) of every numeric census score (``<score>_change``);
- :meth:`Diff.scores`: the same changes in long form, ``score, a, b, change``;
- :meth:`Diff.layers`: per layer, mean JS, the most changed head, mean cosine, and how many
  (what share of) heads changed their label.

:func:`diff_censuses` compares two censuses already computed (scores and labels only: the JS
part needs both models on the same inputs). Censuses of different heads or of different
corpora (other numbers of sentences, token rows or dependency relations) are refused in one
line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
from pandas.api import types as ptypes
from torch import nn

from attnprobe.capture.info import causal_of
from attnprobe.core import html_view
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.errors import InputError
from attnprobe.heads.census_options import CensusOptions
from attnprobe.heads.head_census import Census, census
from attnprobe.heads.labels import Thresholds
from attnprobe.heads.paired_attention import (
    AttentionChange,
    attention_change,
    check_pair,
    common_max_length,
)
from attnprobe.heads.trees import Tree, texts_or_trees
from attnprobe.inputs.text import Text

__all__ = ["KEY", "Diff", "diff", "diff_censuses"]

KEY = ["stack", "kind", "layer", "head", "head_id"]
CATEGORICAL = ("label", "family")  # compared as "a, b, changed" when the census has them
LAYER_KEY = ["stack", "kind", "layer"]


def _attention_kind(model: nn.Module) -> dict[str, bool | None]:
    """What a head's attention means beyond its grid: causal (each token sees only the ones
    before it) or bidirectional, and whether there is an encoder-decoder (cross-attention);
    ``None`` when the model does not say."""
    flag = getattr(getattr(model, "config", None), "is_encoder_decoder", None)
    return {"causal": causal_of(model),
            "encoder-decoder": flag if isinstance(flag, bool) else None}


def _check_kinds(model_a: nn.Module, model_b: nn.Module) -> None:
    """Refuse two models whose attention differs in kind: a causal and a bidirectional head
    of the same index are not one head before and after fine-tuning."""
    kind_a, kind_b = _attention_kind(model_a), _attention_kind(model_b)
    for what, a in kind_a.items():
        b = kind_b[what]
        if a is not None and b is not None and a != b:
            names = {"causal": ("causal", "bidirectional"),
                     "encoder-decoder": ("encoder-decoder", "not encoder-decoder")}[what]
            shown = [names[0] if flag else names[1] for flag in (a, b)]
            raise InputError(f"the models' attention differs in kind: model A "
                             f"({type(model_a).__name__}) is {shown[0]}, model B "
                             f"({type(model_b).__name__}) is {shown[1]}; a diff compares "
                             "two checkpoints of one architecture")


def _groups(table: pd.DataFrame) -> list[tuple[str, str]]:
    return list(dict.fromkeys(zip(table["stack"], table["kind"], strict=True)))


def _shape(table: pd.DataFrame) -> str:
    return (f"{table[['stack', 'kind', 'layer']].drop_duplicates().shape[0]} layers x "
            f"{table['head'].nunique()} heads")


def _stack_names(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, str]:
    """B's attention stacks named as A's, in order (``bert.encoder.layer`` of a classifier
    is ``encoder.layer`` of the bare model it was fine-tuned from)."""
    first, second = _groups(a), _groups(b)
    if [kind for _, kind in first] != [kind for _, kind in second]:
        raise InputError(f"the censuses cover different attention stacks ({len(first)} vs "
                         f"{len(second)}); a diff compares two checkpoints of one architecture")
    return {sb: sa for (sa, _), (sb, _) in zip(first, second, strict=True)}


def _check_heads(a: pd.DataFrame, b: pd.DataFrame) -> None:
    if set(zip(a["kind"], a["layer"], a["head"], strict=True)) != \
            set(zip(b["kind"], b["layer"], b["head"], strict=True)):
        raise InputError(f"the censuses cover different heads ({_shape(a)} vs {_shape(b)}); a "
                         "diff compares the same heads of two checkpoints")


def _token_rows(result: Census) -> int:
    """Real token rows of the census's corpus (every attention site sees them all)."""
    return int(max(result.tally.counts.values(), default=0))


def _words_per_relation(result: Census) -> dict[str, int] | None:
    if result.sums.syntax is None:
        return None
    table = result.syntax(1)
    return dict(zip(table["relation"], table["count"], strict=True))


def _check_corpus(census_a: Census, census_b: Census) -> None:
    """The same corpus, as far as two censuses can tell: the same number of sentences (and
    the same ones skipped), of token rows and, when both were parsed, of words per
    dependency relation. (Two corpora that agree on all of these pass.)"""
    if census_a.n_sentences != census_b.n_sentences or census_a.skipped != census_b.skipped:
        raise InputError(f"the censuses ran over different corpora ({census_a.n_sentences} vs "
                         f"{census_b.n_sentences} sentences, {len(census_a.skipped)} vs "
                         f"{len(census_b.skipped)} skipped)")
    rows = (_token_rows(census_a), _token_rows(census_b))
    if rows[0] != rows[1]:
        raise InputError(f"the censuses ran over different corpora or tokenizers ({rows[0]} vs "
                         f"{rows[1]} token rows in {census_a.n_sentences} sentences); diff two "
                         "censuses of the same sentences")
    words = (_words_per_relation(census_a), _words_per_relation(census_b))
    if None not in words and words[0] != words[1]:
        raise InputError("the censuses ran over different corpora (their dependency trees "
                         "differ); diff two censuses of the same sentences")


@dataclass
class Diff:
    """Two censuses of the same corpus, and optionally how far the two models' weights
    differ on it (:class:`~attnprobe.heads.paired_attention.AttentionChange`).

    Attributes:
        census_a / census_b: the censuses of model A (before) and model B (after).
        change: per-head JS sums of the two models on the same batches (``None`` when the
            diff was made from censuses alone).
        thresholds: label thresholds used for both censuses (``None``: the defaults).
    """

    census_a: Census
    census_b: Census
    change: AttentionChange | None = None
    thresholds: Thresholds | None = None
    _labels: tuple[pd.DataFrame, pd.DataFrame] | None = field(default=None, init=False,
                                                              repr=False)

    def __post_init__(self) -> None:
        for name in ("census_a", "census_b"):
            if not isinstance(getattr(self, name), Census):
                raise InputError(f"{name} must be a Census (attnprobe.heads.census); got "
                                 f"{type(getattr(self, name)).__name__}")
        if self.change is not None and not isinstance(self.change, AttentionChange):
            raise InputError(f"change must be an AttentionChange; got "
                             f"{type(self.change).__name__}")
        a, _ = self._tables()  # checks heads and corpus
        if self.change is not None:
            missing = {(k, la, h) for k, la, h in zip(a["kind"], a["layer"], a["head"],
                                                      strict=True)} - \
                {(k, la, h) for _, k, la, h in self.change.heads}
            if missing:
                raise InputError(f"the attention change lacks {len(missing)} of the censuses' "
                                 "heads; compute it over the same scope")

    @property
    def n_sentences(self) -> int:
        return self.census_a.n_sentences

    def _tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``classify()`` of A and of B, B's stacks named as A's (checked once)."""
        if self._labels is None:
            a = self.census_a.classify(self.thresholds)
            b = self.census_b.classify(self.thresholds)
            stacks = _stack_names(a, b)
            _check_heads(a, b)
            _check_corpus(self.census_a, self.census_b)
            self._labels = (a, b.assign(stack=b["stack"].map(stacks)))
        return self._labels

    def score_columns(self) -> list[str]:
        """The numeric census scores both tables have, in census order."""
        a, b = self._tables()
        return [c for c in a.columns if c not in KEY and c in b.columns
                and ptypes.is_numeric_dtype(a[c]) and not ptypes.is_bool_dtype(a[c])
                and ptypes.is_numeric_dtype(b[c]) and not ptypes.is_bool_dtype(b[c])]

    def _categorical(self) -> list[str]:
        a, b = self._tables()
        return [c for c in CATEGORICAL if c in a.columns and c in b.columns]

    def heads(self) -> pd.DataFrame:
        """One row per head: ``stack, kind, layer, head, head_id``, ``label_a, label_b,
        label_changed`` (and ``family_*`` when the census has families), ``js`` (mean JS per
        query row, nats), ``js_max`` (largest row), ``cosine`` (mean per example),
        ``rows``, ``examples``, then ``<score>_change`` (B − A) for every numeric score."""
        a, b = self._tables()
        merged = a.merge(b, on=KEY, how="inner", suffixes=("_a", "_b"), validate="1:1")
        out = merged[KEY].copy()
        for column in self._categorical():
            out[f"{column}_a"] = merged[f"{column}_a"]
            out[f"{column}_b"] = merged[f"{column}_b"]
            out[f"{column}_changed"] = merged[f"{column}_a"] != merged[f"{column}_b"]
        if self.change is not None:
            out = out.merge(self.change.to_frame(), on=KEY, how="left", validate="1:1")
        changes = {f"{score}_change": merged[f"{score}_b"] - merged[f"{score}_a"]
                   for score in self.score_columns()}
        return pd.concat([out, pd.DataFrame(changes, index=out.index)], axis=1)

    def scores(self) -> pd.DataFrame:
        """Long form: one row per head and numeric score: ``stack, kind, layer, head,
        head_id, score, a, b, change`` (``change = b − a``)."""
        a, b = self._tables()
        scores = self.score_columns()
        long = [frame.melt(id_vars=KEY, value_vars=scores, var_name="score", value_name=side)
                for frame, side in ((a, "a"), (b, "b"))]
        table = long[0].merge(long[1], on=[*KEY, "score"], how="inner", validate="1:1")
        table["change"] = table["b"] - table["a"]
        order = {name: i for i, name in enumerate(scores)}
        table = table.assign(_order=table["score"].map(order))
        table = table.sort_values([*LAYER_KEY, "head", "_order"], kind="stable")
        return table.drop(columns="_order").reset_index(drop=True)

    def layers(self) -> pd.DataFrame:
        """Per layer: ``n_heads``, ``label_changed`` (heads whose label changed) and
        ``label_changed_share``; with the JS part also ``js`` (mean over the layer's heads),
        ``js_rank`` (1 = the layer that changed most), ``js_top`` and ``top_head`` (the most
        changed head) and ``cosine`` (mean)."""
        heads = self.heads()
        grouped = heads.groupby(LAYER_KEY, sort=True)
        table = grouped.size().rename("n_heads").reset_index()
        for column in self._categorical():
            changed = grouped[f"{column}_changed"]
            table[f"{column}_changed"] = changed.sum().to_numpy().astype(int)
            table[f"{column}_changed_share"] = changed.mean().to_numpy()
        if self.change is not None:
            table["js"] = grouped["js"].mean().to_numpy()
            table["js_rank"] = table["js"].rank(ascending=False, method="min").astype(int)
            top = heads.loc[grouped["js"].idxmax().to_numpy()]
            table["js_top"] = top["js"].to_numpy()
            table["top_head"] = top["head_id"].to_numpy()
            table["cosine"] = grouped["cosine"].mean().to_numpy()
        return table

    def _repr_html_(self) -> str | None:
        """Change per head and per layer in a notebook (:mod:`attnprobe.report`)."""
        return html_view.html(self, "diff")

    def __repr__(self) -> str:
        try:
            layers = self.layers()
        except InputError as exc:
            return f"Diff(invalid: {exc})"
        n_heads = int(layers["n_heads"].sum())
        text = (f"Diff({self.n_sentences} sentences, {len(layers)} layers, {n_heads} heads; "
                f"{int(layers['label_changed'].sum())} labels changed")
        if "js" in layers and layers["js"].max() > 0:
            worst = layers.loc[layers["js"].idxmax()]
            text += (f"; mean JS {layers['js'].mean():.4g} nats, most in layer "
                     f"{int(worst['layer'])} ({worst['js']:.4g})")
        elif "js" in layers:
            text += "; attention unchanged (JS 0)"
        return text + ")"


def diff_censuses(census_a: Census, census_b: Census, *,
                  thresholds: Thresholds | None = None) -> Diff:
    """Scores and labels of two censuses of the same corpus, head by head (no JS part).

    Example:
        >>> import copy
        >>> tuned = copy.deepcopy(lm)
        >>> with torch.no_grad():                       # layer 1 without queries: uniform rows
        ...     _ = tuned.blocks[1].attn.q_proj.weight.zero_()
        >>> a, b = (census(m, lm_tok, [prompt], repeated=False, similarity=False)
        ...         for m in (lm, tuned))
        >>> change = diff_censuses(a, b).heads().groupby("layer")["entropy_change"]
        >>> change.min().gt(0).tolist(), change.max().eq(0).tolist()  # uniform: most entropy
        ([False, True], [True, False])
    """
    return Diff(census_a, census_b, None, thresholds)


def diff(model_a: nn.Module, model_b: nn.Module, tokenizer: Any,
         texts: Sequence[Text] | None = None, *, trees: Sequence[Tree] | None = None,
         tokenizer_b: Any = None, options: CensusOptions | None = None,
         thresholds: Thresholds | None = None, corpus: CorpusOptions | None = None,
         **keywords: Any) -> Diff:
    """Compare two checkpoints of one model (e.g. before and after fine-tuning) head by head.

    Args:
        model_a / model_b: the two models (eval mode), attention of the same shape.
        tokenizer: encodes the corpus for both models (so both see the same batches);
            ``tokenizer_b``, model B's own, is only checked to have the same vocabulary.
        texts / trees: the corpus, as for :func:`~attnprobe.heads.census`; with
            ``syntax=True`` texts are parsed once (spaCy, or ``nlp``) for both censuses.
        options: what both censuses compute (:class:`~attnprobe.heads.census_options.
            CensusOptions`; e.g. ``repeated``, the repeated-random-token probe, ``syntax``,
            ``nlp``); head-to-head distances are left out.
        thresholds: label thresholds for both censuses.
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`: scope, batch size, truncation, seed, progress, distributed,
            ``max_length``, a cap on tokens per sentence under the smaller model limit;
            ``seed`` draws the repeated-token probe, the same for both models), and any
            census option by name (``repeated=False``, ``syntax=True`` ...).

    Returns:
        A :class:`Diff` (``.heads()``, ``.scores()``, ``.layers()``; ``.census_a`` and
        ``.census_b`` are the two censuses, head-to-head distances left out).

    Raises:
        InputError: models of different shapes (layers, heads), vocabularies or tokenizers,
            of attention of different kinds (causal vs bidirectional, encoder-decoder vs
            not), a model in training mode, or any bad corpus input (as the census).

    Example:
        >>> import copy
        >>> tuned = copy.deepcopy(lm)
        >>> with torch.no_grad():                       # layer 1 without queries: uniform rows
        ...     _ = tuned.blocks[1].attn.q_proj.weight.zero_()
        >>> d = diff(lm, tuned, lm_tok, [prompt], repeated=False)
        >>> d.layers()["js"].gt(0).tolist()             # mean JS per layer; layer 0 unchanged
        [False, True]
        >>> d.heads().query("layer == 1")["label_b"].unique().tolist()
        ['broad']
    """
    given, own = CorpusOptions.split(keywords)
    walk = CorpusOptions.merged(corpus, given, owner="diff()")
    opts = replace((options or CensusOptions()).with_keywords(own), similarity=False)
    check_pair(model_a, model_b, tokenizer, tokenizer_b)
    _check_kinds(model_a, model_b)
    if (texts is None) == (trees is None):
        raise InputError("give texts or trees (not both)")
    texts, trees = texts_or_trees(texts, trees, opts.syntax, opts.nlp)
    walk = walk.replace(max_length=common_max_length(model_a, model_b, tokenizer, tokenizer_b,
                                                     walk.max_length))
    censuses = [census(model, tokenizer, texts, trees=trees, options=opts, corpus=walk)
                for model in (model_a, model_b)]
    change = attention_change(model_a, model_b, tokenizer, texts, trees=trees, corpus=walk)
    return Diff(censuses[0], censuses[1], change, thresholds)
