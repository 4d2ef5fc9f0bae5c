"""Texts (strings or token ids) in, attention out: :func:`extract` (maps) and
:func:`head_stats` (streaming sums).

Both take the signature every corpus analysis shares, ``(model, tokenizer, texts, *,
corpus=CorpusOptions(...))`` (or the corpus options by name: ``scope``, ``batch_size``,
``truncation`` ...), and split their batches over the ranks of a
``torch.distributed`` process group when one is initialised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnprobe.capture.context import capture
from attnprobe.capture.generation import generate_maps
from attnprobe.capture.info import model_scope
from attnprobe.capture.parts import Reduce
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.distributed import run_sharded
from attnprobe.core.reducers import Reducer, Tally, default_reducers
from attnprobe.inputs.prepared import prepare
from attnprobe.inputs.text import Text, batch_spans, model_inputs
from attnprobe.types import AttentionMap

__all__ = ["extract", "head_stats"]


def extract(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any, *,
            generate: int | None = None, sample: bool = False,
            corpus: CorpusOptions | None = None, **keywords: Any) -> list[AttentionMap]:
    """Attention maps of each text, padding stripped.

    Args:
        texts: the inputs: strings (a text with a tab is a sentence pair) or token ids —
            id sequences, a 2-D id tensor, a tokenizer output with ``attention_mask``
            (:mod:`attnprobe.inputs.token_ids`); ids go to the model as given. Any
            tokenizer works as it ships (no pad token, either padding side). A
            :class:`~attnprobe.inputs.prepared.PreparedCorpus` is read as prepared (its
            token rows and length limit are not computed again).
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`, or its fields by name): ``scope``, which heads to keep
            (``"all"``, ``"layer:3"``, ``"heads:0.2,1.8"`` ...; :mod:`attnprobe.core.scope`;
            a scope that is not a layers × heads grid keeps the smallest grid holding it, a
            map is one ``[layer, head, ...]`` array); ``batch_size``, texts per forward;
            ``truncation``, ``"error"``, ``"cut"`` or ``"skip"`` for texts longer than the
            model allows (:mod:`attnprobe.inputs.text`); ``max_length``, a tighter cap on
            tokens per text than the model's own; ``progress``, a progress bar over
            batches; ``distributed``, split the batches over the ranks of an initialised
            ``torch.distributed`` group and gather every map on every rank (default: when a
            group is initialised); ``seed``, for ``sample`` (extraction draws nothing at
            random otherwise).
        generate: continue each text (the prompt) by this many tokens with a causal
            language model and return one map per text over prompt + generated tokens, equal
            to one forward over the whole sequence (``prompt_length`` marks where generation
            began; :mod:`attnprobe.capture.generation`). Prompt + ``generate`` must fit the
            model's positions (``truncation`` applies to the prompt).
        sample: with ``generate``, draw each token (seeded by ``seed``, once per batch)
            instead of taking the most likely one.

    Returns:
        ``list[AttentionMap]``: one per text (one per text and attention stack for
        encoder-decoder models), each ``[layer, head, query, key]`` with its token ids
        (``query_ids`` / ``key_ids``); ``example_id`` is the text's index in ``texts``.
        Batches are padded on the right, so a text's maps do not depend on the other texts
        of its batch.

    Example:
        >>> model, tok = ap.load_model("minilm")
        >>> maps = ap.extract(model, tok, ["The cat sat on the mat."], scope="layer:0")
    """
    walk = CorpusOptions.merged(corpus, keywords, owner="extract()")
    if generate is not None:
        found = generate_maps(model, tokenizer, texts, generate, sample=sample, corpus=walk)
        return [item.amap for item in found]
    prepared = prepare(model, tokenizer, texts)
    kept = prepared.corpus(truncation=walk.truncation, max_length=walk.max_length)
    scope = model_scope(model, walk.scope)

    def run(span: slice) -> list[AttentionMap]:
        batch = prepared.inputs([int(i) for i in kept.ids[span]], truncation=walk.truncation,
                                max_length=walk.max_length)
        with torch.no_grad(), capture(model, scope=scope, tokenizer=tokenizer,
                                      example_ids=kept.ids[span]) as cap:
            model(**model_inputs(model, batch))
        return cap.maps

    spans = batch_spans(len(kept.texts), walk.batch())
    parts = run_sharded(run, spans, distributed=walk.distributed, progress=walk.progress,
                        desc="extract")
    return [amap for part in parts for amap in part]


def head_stats(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | Any, *,
               reducers: Sequence[Reducer] | None = None, query_block: int | None = None,
               corpus: CorpusOptions | None = None, **keywords: Any) -> Tally:
    """Streaming per-head statistics over a corpus; no attention map is kept.

    Arguments as :func:`extract` (``corpus`` and the corpus keywords), plus ``reducers``
    (default: entropy, max weight, previous/self/next and first-key mass) and
    ``query_block`` (query rows per block; default as many as fit in 16 MiB).

    Returns a :class:`~attnprobe.core.reducers.Tally` (``.summary()`` for one row per head,
    ``.to_frame()`` tidy); tallies of different corpora merge with ``+``.

    Example:
        >>> tally = ap.head_stats(model, tok, texts, scope="layer:0")  # no [query, key] kept
        >>> tally.summary()[["head_id", "entropy", "max_weight"]].shape   # one row per head
        (12, 3)
        >>> int(tally.to_frame()["count"].iloc[0])      # query rows: 9 + 10 tokens
        19
        >>> halves = (ap.head_stats(model, tok, texts[:1], scope="layer:0")
        ...           + ap.head_stats(model, tok, texts[1:], scope="layer:0"))
        >>> np.allclose(halves.summary()["entropy"], tally.summary()["entropy"])  # merge exact
        True
    """
    walk = CorpusOptions.merged(corpus, keywords, owner="head_stats()")
    prepared = prepare(model, tokenizer, texts)
    kept = prepared.corpus(truncation=walk.truncation, max_length=walk.max_length)
    reducers = list(reducers) if reducers is not None else default_reducers()
    scope = model_scope(model, walk.scope)

    def run(span: slice) -> Tally:
        batch = prepared.inputs([int(i) for i in kept.ids[span]], truncation=walk.truncation,
                                max_length=walk.max_length)
        with torch.no_grad(), capture(model, scope=scope,
                                      parts=[Reduce(reducers, query_block)]) as cap:
            model(**model_inputs(model, batch))
        return cap.tally

    spans = batch_spans(len(kept.texts), walk.batch())
    parts = run_sharded(run, spans, distributed=walk.distributed, progress=walk.progress,
                        desc="head_stats")
    return sum(parts, Tally())
