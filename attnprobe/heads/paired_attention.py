"""How much each head's attention changed between two models on the same inputs.

Both models run on the same batches (the census's: sorted by length, encoded once). For every
real query row of every head the Jensen–Shannon divergence between the two models' rows is
summed (natural log, exact, so each row lies in ``[0, ln 2]`` and a model compared with itself
gives 0), together with the number of rows; the largest row is kept too. Kovaleva et al.'s
(2019 §4.3) measure rides along: the cosine similarity of the two flattened
``[query, key]`` maps of each example and head, summed over examples. Everything is a sum, a
count or a maximum, so batches, processes and machines merge exactly (``+``).

Two models can be compared when their attention has the same shape (layers × heads of every
attention stack) and they read the same tokens: the same vocabulary, or two tokenizers with
the same vocabulary. :func:`check_pair` says, in one line, why two models cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture.calls import BatchPatterns
from attnprobe.capture.context import capture
from attnprobe.capture.info import attention_sizes, model_scope
from attnprobe.capture.parts import Keep
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.display import counted, describe
from attnprobe.core.distributed import run_sharded
from attnprobe.core.divergence import jsd
from attnprobe.core.merging import Summable, trivial_merge
from attnprobe.core.scope import head_id
from attnprobe.errors import InputError
from attnprobe.heads.census_batches import CensusBatch, plan_batches
from attnprobe.heads.trees import Tree
from attnprobe.inputs.text import Text, check_inputs, max_length_of, model_inputs
from attnprobe.inputs.token_ids import input_vocab_size

__all__ = ["CHANGE_COLUMNS", "AttentionChange", "attention_change", "check_pair",
           "common_max_length"]

HeadKey = tuple[str, str, int, int]  # (stack, kind, layer, head)
CHANGE_COLUMNS = ["stack", "kind", "layer", "head", "head_id", "js", "js_max", "cosine", "rows",
                  "examples"]
# Divergences are computed on chunks of about this many float64 weights.
CHUNK_ELEMENTS = 1 << 21


def _empty() -> torch.Tensor:
    return torch.zeros(0, dtype=torch.float64)


@dataclass
class AttentionChange(Summable):
    """Mergeable per-head sums comparing two models' weights on the same query rows.

    Attributes (one entry per head of ``heads``, float64):
        js: ``Σ_rows JS(a_row, b_row)`` in nats.
        js_max: the largest row divergence seen.
        cosine: ``Σ_examples cos(vec A, vec B)`` of the flattened ``[query, key]`` maps.
        rows / examples: real query rows and examples summed over.
    """

    heads: tuple[HeadKey, ...] = ()
    js: torch.Tensor = field(default_factory=_empty)
    js_max: torch.Tensor = field(default_factory=_empty)
    cosine: torch.Tensor = field(default_factory=_empty)
    rows: torch.Tensor = field(default_factory=_empty)
    examples: torch.Tensor = field(default_factory=_empty)

    @classmethod
    def from_batches(cls, a: BatchPatterns, b: BatchPatterns) -> AttentionChange:
        """Sums over one padded batch of one (stack, kind), weights of model A and model B.
        Heads are named after model A's stack."""
        if (a.kind, a.layers, a.heads) != (b.kind, b.layers, b.heads) \
                or a.pattern.shape != b.pattern.shape:
            raise InputError(f"the models' attention differs in shape ({a.kind} attention of "
                             f"{a.stack}: {tuple(a.pattern.shape)} vs {tuple(b.pattern.shape)})")
        if not (torch.equal(a.query_valid, b.query_valid)
                and torch.equal(a.key_valid, b.key_valid)):
            raise InputError("the two models saw different tokens on the same batch (their "
                             "tokenizers or padding differ)")
        n_batch, n_layers, n_heads, q_len, k_len = a.pattern.shape
        valid = a.query_valid[:, None, :, None]  # [batch, 1, query, 1]
        js = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        js_max = torch.zeros_like(js)
        cosine = torch.zeros_like(js)
        step = max(1, CHUNK_ELEMENTS // max(1, n_heads * q_len * k_len))
        for li in range(n_layers):
            for start in range(0, n_batch, step):
                part = slice(start, start + step)
                # padding rows may hold anything (even NaN): as zero rows they compare equal
                pa = torch.where(valid[part], a.pattern[part, li].to(torch.float64), 0.0)
                pb = torch.where(valid[part], b.pattern[part, li].to(torch.float64), 0.0)
                row_js = jsd(pa, pb)  # [batch, head, query]
                js[li] += row_js.sum(dim=(0, 2))
                js_max[li] = torch.maximum(js_max[li], row_js.amax(dim=(0, 2)))
                dot = (pa * pb).sum(dim=(-2, -1))  # [batch, head]
                norms = (pa.square().sum(dim=(-2, -1)) * pb.square().sum(dim=(-2, -1))).sqrt()
                cosine[li] += (dot / norms.clamp(min=torch.finfo(torch.float64).tiny)).sum(0)
        rows = float(a.query_valid.sum())
        keys = tuple((a.stack, a.kind, layer, head) for layer in a.layers for head in a.heads)
        count = len(keys)
        return cls(keys, js.flatten(), js_max.flatten(), cosine.flatten(),
                   torch.full((count,), rows, dtype=torch.float64),
                   torch.full((count,), float(n_batch), dtype=torch.float64))

    @classmethod
    def joined(cls, parts: Sequence[AttentionChange]) -> AttentionChange:
        """The heads of several (stack, kind) groups of one batch side by side."""
        return cls(tuple(key for p in parts for key in p.heads),
                   *(torch.cat([getattr(p, name) for p in parts]) if parts else _empty()
                     for name in ("js", "js_max", "cosine", "rows", "examples")))

    def __repr__(self) -> str:
        rows = float(self.rows.max()) if len(self.rows) else 0.0
        js = float(self.js.sum() / self.rows.sum()) if float(self.rows.sum()) else None
        return describe("AttentionChange", counted(len(self.heads), "head"),
                        counted(float(self.examples.max()) if len(self.examples) else 0,
                              "example"), counted(rows, "row"),
                        None if js is None else f"mean JS {js:.3g} nats")

    def __add__(self, other: AttentionChange) -> AttentionChange:
        if not isinstance(other, AttentionChange):
            return NotImplemented
        if (trivial := trivial_merge(self, other, "attention changes")) is not None:
            return trivial
        return AttentionChange(self.heads, self.js + other.js,
                               torch.maximum(self.js_max, other.js_max),
                               self.cosine + other.cosine, self.rows + other.rows,
                               self.examples + other.examples)

    def to_frame(self) -> pd.DataFrame:
        """One row per head (:data:`CHANGE_COLUMNS`): mean JS per query row (nats), its
        largest row, mean cosine similarity per example, and the rows and examples seen."""
        if not self.heads:
            return pd.DataFrame(columns=CHANGE_COLUMNS)
        if not bool((self.rows > 0).all()):
            raise InputError("no attention rows were seen: nothing to compare")
        frame = pd.DataFrame(list(self.heads), columns=["stack", "kind", "layer", "head"])
        frame.insert(4, "head_id", [head_id(k[2], k[3]) for k in self.heads])
        frame["js"] = (self.js / self.rows).numpy()
        frame["js_max"] = self.js_max.numpy()
        frame["cosine"] = (self.cosine / self.examples).numpy()
        frame["rows"] = self.rows.numpy().astype("int64")
        frame["examples"] = self.examples.numpy().astype("int64")
        return frame


# ------------------------------------------------------------------------------- checks
def _check_tokenizers(tokenizer: Any, tokenizer_b: Any) -> None:
    vocab_of = [getattr(t, "get_vocab", None) for t in (tokenizer, tokenizer_b)]
    if all(callable(v) for v in vocab_of):
        first, second = (v() for v in vocab_of)
        if first != second:
            words = sorted(set(first.items()) ^ set(second.items()), key=str)
            sample = f"; e.g. {words[0][0]!r}" if words else ""
            raise InputError(f"the tokenizers differ: vocabularies of {len(first)} and "
                             f"{len(second)} tokens are not the same{sample}; a diff needs "
                             "models that read the same tokens")
        return
    sizes = [len(t) if hasattr(t, "__len__") else None for t in (tokenizer, tokenizer_b)]
    if None not in sizes and sizes[0] != sizes[1]:
        raise InputError(f"the tokenizers differ: vocabularies of {sizes[0]} and {sizes[1]} "
                         "tokens; a diff needs models that read the same tokens")


def check_pair(model_a: nn.Module, model_b: nn.Module, tokenizer: Any = None,
               tokenizer_b: Any = None) -> None:
    """Raise a one-line :class:`InputError` unless the two models can be compared head by head:
    both in eval mode, attention of the same shape, the same vocabulary (and, when two
    tokenizers are given, the same tokens in them)."""
    for name, model in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(model, nn.Module):
            raise InputError(f"{name} must be a torch module; got {type(model).__name__}")
        if model.training:
            raise InputError(f"{name} is in training mode (dropout would make its attention "
                             f"random); call {name}.eval() first")
    sizes_a, sizes_b = attention_sizes(model_a), attention_sizes(model_b)
    if sizes_a != sizes_b:
        raise InputError(f"the models differ in shape: {sizes_a[0]} layers x {sizes_a[1]} heads "
                         f"vs {sizes_b[0]} x {sizes_b[1]}; a diff compares two checkpoints of "
                         "one architecture")
    vocab_a, vocab_b = input_vocab_size(model_a), input_vocab_size(model_b)
    if vocab_a is not None and vocab_b is not None and vocab_a != vocab_b:
        raise InputError(f"the models' vocabularies differ ({vocab_a} vs {vocab_b} token "
                         "embeddings); a diff needs models that read the same tokens")
    if tokenizer is not None and tokenizer_b is not None and tokenizer_b is not tokenizer:
        _check_tokenizers(tokenizer, tokenizer_b)


def common_max_length(model_a: nn.Module, model_b: nn.Module, tokenizer: Any,
                      tokenizer_b: Any = None, max_length: int | None = None) -> int | None:
    """The most tokens both models accept (and at most ``max_length``), so that both see the
    same sentences, cut or skipped alike."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length < 1):
        raise InputError(f"max_length must be a positive integer; got {max_length!r}")
    limits = [max_length_of(model_a, tokenizer),
              max_length_of(model_b, tokenizer_b if tokenizer_b is not None else tokenizer),
              max_length]
    limits = [n for n in limits if n is not None]
    return min(limits) if limits else None


# ------------------------------------------------------------------------------- the pass
@dataclass(frozen=True)
class ChangeRun:
    """What every batch of one comparison shares."""

    model_a: nn.Module
    model_b: nn.Module
    scope: Any

    def weights(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> list[BatchPatterns]:
        with torch.no_grad(), capture(model, self.scope, parts=[Keep()], stop_early=True) as cap:
            model(**model_inputs(model, inputs))
        return cap.batches()

    def __call__(self, group: CensusBatch) -> AttentionChange:
        inputs, _ = group.inputs()
        first = self.weights(self.model_a, inputs)
        second = self.weights(self.model_b, inputs)
        if [g.kind for g in first] != [g.kind for g in second]:
            raise InputError("the models' attention differs in shape (different attention "
                             "stacks)")
        return AttentionChange.joined([AttentionChange.from_batches(a, b)
                                       for a, b in zip(first, second, strict=True)])


def attention_change(model_a: nn.Module, model_b: nn.Module, tokenizer: Any,
                     texts: Sequence[Text] | None = None, *, trees: Sequence[Tree] | None = None,
                     tokenizer_b: Any = None, corpus: CorpusOptions | None = None,
                     **keywords: Any) -> AttentionChange:
    """Run both models on the same batches and sum, per head, how far their weights differ.

    Args:
        model_a / model_b: two models with attention of the same shape, e.g. a checkpoint
            before and after fine-tuning (eval mode).
        tokenizer: encodes the texts for both models; ``tokenizer_b`` (model B's own) is only
            checked to hold the same vocabulary.
        texts / trees: the corpus (as for :func:`~attnprobe.heads.census`).
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`, or its fields by name: scope, batch size, truncation, progress,
            max length, distributed) as for the census; the length limit is the smaller of
            the two models'. ``seed`` is unused (nothing is drawn).

    Returns:
        An :class:`AttentionChange`; ``.to_frame()`` gives one row per head.

    Example:
        >>> import copy
        >>> tuned = copy.deepcopy(lm)
        >>> with torch.no_grad():                       # layer 1 without queries: uniform rows
        ...     _ = tuned.blocks[1].attn.q_proj.weight.zero_()
        >>> change = attention_change(lm, tuned, lm_tok, [prompt]).to_frame()
        >>> change.groupby("layer")["js"].max().gt(0).tolist()   # layer 0 is unchanged
        [False, True]
        >>> change["rows"].tolist() == [17] * 8         # [BOS] + 16 query rows, per head
        True
    """
    walk = CorpusOptions.merged(corpus, keywords, owner="attention_change()")
    check_pair(model_a, model_b, tokenizer, tokenizer_b)
    if (texts is None) == (trees is None):
        raise InputError("give texts or trees (not both)")
    texts = check_inputs(texts) if texts is not None else None  # strings or token ids
    scope = model_scope(model_a, walk.scope)
    limit = common_max_length(model_a, model_b, tokenizer, tokenizer_b, walk.max_length)
    batches, _ = plan_batches(model_a, tokenizer, texts, trees=trees, batch_size=walk.batch(),
                              truncation=walk.truncation_mode, max_length=limit)
    parts = run_sharded(ChangeRun(model_a, model_b, scope), batches,
                        distributed=walk.distributed, progress=walk.progress,
                        desc="attention change")
    return sum(parts, AttentionChange())
