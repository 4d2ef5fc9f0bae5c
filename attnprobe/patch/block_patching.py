"""The Python entry points of residual-stream and MLP-output patching: :func:`residual` and
:func:`mlp` (experiments ``residual`` and ``mlp`` of :func:`attnprobe.patch.run`; the
experiment: :mod:`attnprobe.patch.stream_patching`, the sites: :mod:`attnprobe.patch.stream`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from torch import nn

from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.patch.experiments import MetricLike, run

__all__ = ["mlp", "residual"]


def residual(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike,
             *, stream: str = "resid_pre", positions: str = "each",
             direction: str = "denoising", corpus: CorpusOptions | None = None,
             **keywords: Any) -> pd.DataFrame:
    """Residual-stream patching per layer × position (TransformerLens's
    ``get_act_patch_resid_pre`` / ``_mid`` / ``_post``;
    [causal methods](../guide/causal-methods.md#activation-patching)): the base run
    (corrupted when denoising, clean when noising) with the residual stream ``[d_model]`` of
    one layer at one position taken from the other run — batched, one patch per repetition of
    the examples. ``corpus`` and the other keywords (``scope``: the layers patched, whole
    layers, ``"layer:3"``, ``"layers:0-2"``; ``batch_size``, ``metric_positions``, ``pairs``
    ...) are those of :func:`attnprobe.patch.run`.

    Args:
        stream: ``"resid_pre"`` (entering block ``l``), ``"resid_mid"`` (after its attention,
            before its MLP: pre-norm models only; BERT-style post-norm models are refused)
            or ``"resid_post"`` (leaving the block). The table's ``site``.
        positions: ``"each"`` (one patch per position) or ``"all"`` (every position of the
            layer at once; ``position`` is then ``<NA>``).
        direction: ``"denoising"`` (sufficiency) or ``"noising"`` (necessity).

    Returns:
        The table of :func:`attnprobe.patch.heads` (``head`` is ``<NA>``): one row per
        example, layer and position.

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> table = ap.patch.residual(model, tok, clean, corrupt, "logit:next",
        ...                           metric_positions=copies)
        >>> table.pivot_table(index="layer", columns="position", values="effect")
    """
    return run(model, tokenizer, clean, corrupt, metric, "residual", corpus=corpus,
               stream=stream, positions=positions, direction=direction, **keywords)


def mlp(model: nn.Module, tokenizer: Any, clean: Any, corrupt: Any, metric: MetricLike, *,
        positions: str = "each", direction: str = "denoising",
        corpus: CorpusOptions | None = None, **keywords: Any) -> pd.DataFrame:
    """MLP-output patching per layer × position (TransformerLens's ``mlp_out`` of
    ``get_act_patch_block_every``): what layer ``l``'s MLP adds to the residual stream at one
    position, taken from the other run. Pre-norm models (GPT-2, LLaMA-layout decoders, the
    reference models); the arguments and the table are those of :func:`residual` (``site``
    ``mlp_out``).

    Example:
        >>> model, tok = ap.load_model("ref:llama")
        >>> table = ap.patch.mlp(model, tok, ["the cat sat on the"], ["the dog sat on the"],
        ...                      "logit_diff:mat,cat")
        >>> ap.patch.summary(table, ci=0.95)  # one pair: the intervals are NaN, with a note
    """
    return run(model, tokenizer, clean, corrupt, metric, "mlp", corpus=corpus,
               positions=positions, direction=direction, **keywords)
