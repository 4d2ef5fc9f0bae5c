"""KV-cache decoding steps folded into one forward call per sequence.

``model.generate`` runs the prompt once (``[batch, head, P, P]`` weights per layer), then one
step per new token whose single query row attends to the cache (``[batch, head, 1, P + i]``).
A capture records each of those forwards (:class:`~attnprobe.capture.calls.ForwardCall`,
marked ``continues`` when it is a cache step of the call before it). Here a run of them
becomes one call whose weights are ``[batch, head, T, T]`` over the ``T`` tokens fed: the
prompt's rows from the prompt forward, one row per step from that step, and exactly 0 on
the keys a row never saw (after its own position for causal attention, before the window
for a sliding-window cache, whose steps hold only the last keys). For a causal model those
are the weights of one forward over the whole sequence.

Each run is stacked once, when the maps are first read, with one copy of every stored row:
decoding itself pays only for keeping each step's row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnprobe.capture.calls import ForwardCall
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError

__all__ = ["cache_rows", "fold_steps"]


def cache_rows(cache: object) -> torch.Tensor | None:
    """``[batch, cached]``: one number per row and cached token of a transformers KV cache
    (the first feature of the first layer's first head's keys), enough to tell whether a
    step's rows still continue the rows of the step before — beam search reorders them —
    or ``None`` for a cache of another kind."""
    cache = getattr(cache, "self_attention_cache", cache)  # encoder-decoder caches
    layers = getattr(cache, "layers", None)
    keys = getattr(layers[0], "keys", None) if isinstance(layers, (list, tuple)) and layers \
        else None
    if not isinstance(keys, torch.Tensor) or keys.ndim != 4 or not keys.numel():
        return None
    return keys[:, 0, :, 0].detach().to("cpu", torch.float32).clone()


def _runs(calls: Sequence[ForwardCall]) -> list[list[ForwardCall]]:
    """Consecutive calls grouped: a call that continues the one before joins its run."""
    runs: list[list[ForwardCall]] = []
    for call in calls:
        if call.continues and runs and set(call.patterns) == set(runs[-1][0].patterns) \
                and set(call.scores) == set(runs[-1][0].scores):
            runs[-1].append(call)
        else:
            runs.append([call])
    return runs


def _stack_rows(site: Site, blocks: list[torch.Tensor], fill: float) -> torch.Tensor | None:
    """``[batch, head, Σq, K]`` from the blocks ``[batch, head, q_i, k_i]`` of one site, or
    ``None`` when they do not line up as one sequence.

    Self-attention: the keys of block ``i`` end at its last query (``k_i`` keys, the most
    recent ones); cross-attention: every block has the same keys.
    """
    batch, heads = blocks[0].shape[:2]
    rows = sum(b.shape[2] for b in blocks)
    keys = rows if site.kind == "self" else blocks[0].shape[3]
    if any(b.shape[:2] != (batch, heads) for b in blocks) or (
            site.kind != "self" and any(b.shape[3] != keys for b in blocks)):
        return None
    out = blocks[0].new_full((batch, heads, rows, keys), fill)
    row = 0
    for block in blocks:
        q, k = block.shape[2], block.shape[3]
        end = row + q if site.kind == "self" else keys
        if end - k < 0:  # more keys than tokens so far: not a continuation of these calls
            return None
        out[:, :, row:row + q, end - k:end] = block
        row += q
    return out


def _fold(run: list[ForwardCall]) -> list[ForwardCall]:
    """One call for a run (the run unchanged if its blocks do not line up)."""
    if any(call.reordered for call in run):
        raise InputError("the captured decoding steps reorder their rows (beam search "
                         "swaps hypotheses between steps), so no row is one sequence; capture "
                         "one forward over each returned sequence instead (ap.extract on the "
                         "generated ids)")
    first, last = run[0], run[-1]
    patterns: dict[Site, torch.Tensor] = {}
    scores: dict[Site, torch.Tensor] = {}
    for kept, out, fill in ((first.patterns, patterns, 0.0),
                            (first.scores, scores, float("-inf"))):
        for site in kept:
            what = "patterns" if out is patterns else "scores"
            stacked = _stack_rows(site, [getattr(c, what)[site] for c in run], fill)
            ids = last.ids.get(site.side)
            if stacked is None or (ids is not None and ids.shape[1] != stacked.shape[2]):
                return run
            out[site] = stacked
    lengths = {}
    for side, ids in first.ids.items():
        if ids is not None:
            lengths[side] = first.valid_mask(side, ids.shape[0], ids.shape[1]).sum(-1)
    return [ForwardCall(ids=dict(last.ids), valid=dict(last.valid),
                        fresh={side: t.shape[1] for side, t in last.ids.items() if t is not None},
                        patterns=patterns, scores=scores, prompt_lengths=lengths)]


def fold_steps(calls: Sequence[ForwardCall]) -> list[ForwardCall]:
    """``calls`` with every run of KV-cache steps folded into the call that began it (module
    docstring); calls that are no decoding step are returned as they are. The folded calls
    carry ``prompt_lengths``: the real tokens each example had before the steps."""
    out: list[ForwardCall] = []
    for run in _runs(calls):
        if len(run) == 1 or (not run[0].patterns and not run[0].scores):
            out += run
            continue
        out += _fold(run)
    return out
