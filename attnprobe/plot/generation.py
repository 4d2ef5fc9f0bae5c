"""Attention of generation steps (:func:`generation_attention`): what the model looked at
when it wrote each token, in the prompt and among the tokens it had written before.

The input is a map captured during generation (``ap.extract(model, tok, prompt,
generate=N)``), whose query tokens from ``prompt_length`` on are the generated ones. The step
that wrote generated token ``g_k`` is the query row *before* it: the last prompt token wrote
``g_1``, ``g_1``'s row wrote ``g_2``, and so on (the row of the last generated token wrote
nothing). So the steps are rows ``prompt_length - 1 .. n - 2``, each labelled with the token it
wrote.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pandas as pd

from attnprobe.core.scope import head_id
from attnprobe.errors import InputError
from attnprobe.plot.common import new_figure, seaborn, set_token_ticks
from attnprobe.plot.figure import figure
from attnprobe.types import AttentionMap

RANK = 80  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["generation_attention", "generation_table", "generation_weights"]

Reduce = Literal["mean", "max"]
REDUCERS = {"mean": np.mean, "max": np.max}


def generation_weights(attention: AttentionMap, *, layer: int | None = None,
                       head: int | None = None, reduce: Reduce = "mean") -> np.ndarray:
    """``[generated, key]`` weights of the generation steps (module docstring): row ``k`` is
    the query row that wrote generated token ``k`` (``prompt_length - 1 + k``). One head
    (``layer`` and ``head``), the heads of one layer (``layer`` only) or every captured head,
    combined by ``reduce``.

    Raises:
        InputError: not a generation map, ``head`` without ``layer``, an unknown head or
            reducer.
    """
    if not isinstance(attention, AttentionMap):
        raise InputError(f"expected an AttentionMap from extract(..., generate=N); got "
                         f"{type(attention).__name__}")
    if attention.prompt_length is None or attention.prompt_length == len(attention.query_tokens):
        raise InputError("this map has no generated tokens: capture it with "
                         "ap.extract(model, tokenizer, prompt, generate=N)")
    if reduce not in REDUCERS:
        raise InputError(f"reduce must be one of {sorted(REDUCERS)}; got {reduce!r}")
    if head is not None and layer is None:
        raise InputError("head= needs layer= (a head is L<layer>H<head>)")
    rows = slice(attention.prompt_length - 1, len(attention.query_tokens) - 1)
    if head is not None:
        return attention.head(layer, head)[rows].numpy()
    pattern = attention.pattern.numpy()  # [layer, head, query, key]
    if layer is not None:
        if layer not in attention.layers:
            raise InputError(f"layer {layer} was not captured; layers {list(attention.layers)}")
        pattern = pattern[attention.layers.index(layer)][None]
    return REDUCERS[reduce](pattern[:, :, rows], axis=(0, 1))


def generation_table(attention: AttentionMap, *, layer: int | None = None,
                     head: int | None = None, reduce: Reduce = "mean") -> pd.DataFrame:
    """The tidy table the generation figure draws: one row per generated token and key,
    ``step, token, key_pos, key_token, weight`` (:func:`generation_weights`).

    Example:
        >>> text = ap.extract(lm, lm_tok, "t05 t11 t40", generate=2)[0]
        >>> generation_table(text)["step"].unique().tolist()
        [0, 1]
    """
    weights = generation_weights(attention, layer=layer, head=head, reduce=reduce)
    start = attention.prompt_length
    steps, keys = np.meshgrid(np.arange(weights.shape[0]), np.arange(weights.shape[1]),
                              indexing="ij")
    return pd.DataFrame({
        "step": steps.ravel(),
        "token": [attention.query_tokens[start + s] for s in steps.ravel()],
        "key_pos": keys.ravel(),
        "key_token": [attention.key_tokens[k] for k in keys.ravel()],
        "weight": weights.ravel()})


def _title(layer: int | None, head: int | None, reduce: str) -> str:
    if head is not None:
        return head_id(layer, head)
    return f"{reduce} over the heads of layer {layer}" if layer is not None \
        else f"{reduce} over every head"


@figure(data=generation_table, rank=80,
        shows="what the step that wrote each token attended to, and its share on the prompt",
        source="AttentionMap from ``extract(..., generate=N)``")
def generation_attention(attention: AttentionMap, *, layer: int | None = None,
                         head: int | None = None, reduce: Reduce = "mean",
                         cmap: str = "Blues") -> Any:
    """What the model attended to when it wrote each token, and how much of it was the
    prompt.

    Left: a heatmap with one row per generation step, labelled with the token that step
    wrote (in the order written; the step is the query row before that token, module
    docstring), and one column per key (prompt, then generated tokens), cut by a line where
    the prompt ends; causal masking leaves the upper right empty (no step saw the last
    token). Right: per step, the share of its attention on the prompt (1 means it read only
    the prompt; the first step always does).

    Args:
        attention: a map from ``ap.extract(model, tokenizer, prompt, generate=N)``.
        layer, head: one head (both), the heads of one layer (``layer``), or every captured
            head (neither), combined by ``reduce`` (``"mean"`` or ``"max"``).

    Returns:
        A matplotlib ``Figure`` with the heatmap, its colour bar and the prompt-share axes.

    Example:
        >>> generated = ap.extract(lm, lm_tok, [prompt], generate=4)[0]   # [2, 4, 21, 21]
        >>> fig = ap.plot.generation_attention(generated, layer=1)
        >>> heat = fig.axes[0]                          # one row per generated token
        >>> len(heat.get_yticklabels()), len(heat.get_xticklabels())   # 4 steps × 21 keys
        (4, 21)
    """
    weights = generation_weights(attention, layer=layer, head=head, reduce=reduce)
    n_gen, n_keys = weights.shape
    n_prompt = attention.prompt_length
    fig = new_figure(3.6 + 0.36 * n_keys, 1.4 + 0.36 * n_gen)
    heat, share = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(n_keys, 4), 3]})
    seaborn().heatmap(weights, ax=heat, cmap=cmap, vmin=0.0, vmax=float(weights.max()) or 1.0,
                      cbar_kws={"label": "attention weight"})
    set_token_ticks(heat, "x", attention.readable_tokens("key"), rotate=True, offset=0.5)
    set_token_ticks(heat, "y", attention.readable_tokens()[n_prompt:], offset=0.5)
    heat.tick_params(axis="y", labelrotation=0)
    heat.axvline(n_prompt, color="#d62728", linewidth=1.5, gid="prompt-end")
    heat.set_xlabel(f"key token (prompt: first {n_prompt})")
    heat.set_ylabel("token written at this step")
    heat.set_title(_title(layer, head, reduce))
    mean = weights if reduce == "mean" else generation_weights(attention, layer=layer, head=head)
    on_prompt = mean[:, :n_prompt].sum(-1)  # rows of a mean still sum to 1; of a max, not
    share.plot(on_prompt, np.arange(n_gen) + 0.5, marker="o", color="#1f77b4", gid="on-prompt")
    share.set_xlim(0.0, 1.05)
    share.set_ylim(n_gen, 0)
    share.set_yticks([])
    share.set_xlabel("share on the prompt")
    return fig
