"""From what a capture kept to results: padded batches and padding-stripped maps.

The recorder stores each forward call's kept weights per site (:class:`ForwardCall`); here
they are grouped by attention stack, stacked once per call, and either handed over still
padded (:func:`batch_patterns`) or cut into one :class:`~attnprobe.types.AttentionMap` per
example (:func:`build_maps`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnprobe.capture.calls import BatchPatterns, ForwardCall, Side
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, ModelInfo

__all__ = ["batch_patterns", "build_maps"]

TokensOf = Callable[[torch.Tensor], list[str]]


def _groups(call: ForwardCall) -> dict[tuple[str, str], list[Site]]:
    """The call's kept sites by (stack, kind), in layer order."""
    groups: dict[tuple[str, str], list[Site]] = {}
    for site in sorted(call.patterns, key=lambda s: s.layer):
        groups.setdefault((site.stack, site.kind), []).append(site)
    return groups


def _stack_group(call: ForwardCall, sites: list[Site]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[batch, layer, head, query, key]`` of one (stack, kind), and its scores if kept."""
    heads_of = {call.patterns[s].shape[1] for s in sites}
    if len(heads_of) != 1:
        raise InputError(f"layers of {sites[0].stack} have different head counts {heads_of}")
    pattern = torch.stack([call.patterns[s] for s in sites], dim=1)
    scores = None
    if all(s in call.scores for s in sites):
        scores = torch.stack([call.scores[s] for s in sites], dim=1)
    return pattern, scores


def batch_patterns(calls: Sequence[ForwardCall],
                   kept_heads: dict[Site, tuple[int, ...]]) -> list[BatchPatterns]:
    """Per call and (stack, kind): the kept weights, still padded (no per-example cuts)."""
    out = []
    for call in calls:
        for (stack, kind), sites in _groups(call).items():
            pattern, _ = _stack_group(call, sites)
            batch, _, _, q_len, k_len = pattern.shape
            q_valid, _, q_ids = call.token_view(sites[0].side, batch, q_len)
            k_valid, _, k_ids = call.token_view(sites[0].key_side, batch, k_len)
            out.append(BatchPatterns(pattern=pattern, query_valid=q_valid, key_valid=k_valid,
                                     query_ids=q_ids, key_ids=k_ids,
                                     layers=tuple(s.layer for s in sites),
                                     heads=kept_heads[sites[0]], stack=stack, kind=kind))
    return out


def _cut(valid: torch.Tensor) -> slice | torch.Tensor:
    """Index of the real tokens: a slice when they are contiguous (left/right padding)."""
    where = valid.nonzero().flatten()
    first, last = int(where[0]), int(where[-1])
    return slice(first, last + 1) if last - first + 1 == len(where) else valid


def _tokens(call: ForwardCall, side: Side, b: int, valid: torch.Tensor, are_tokens: bool,
            tokens_of: TokensOf | None) -> list[str]:
    ids = call.ids.get(side)
    if not are_tokens:  # e.g. learned pooling queries
        return [f"[query {i}]" for i in range(int(valid.sum()))]
    if ids is None or ids.shape[-1] < valid.shape[-1]:
        return [f"[{i}]" for i in range(int(valid.sum()))]
    real = ids[b, ids.shape[-1] - valid.shape[-1]:][valid]
    return tokens_of(real) if tokens_of else [str(int(i)) for i in real]


def _example_map(call: ForwardCall, sites: list[Site], b: int, pattern: torch.Tensor,
                 scores: torch.Tensor | None, info: ModelInfo, tokens_of: TokensOf | None,
                 example_id: str, *, heads: tuple[int, ...], edited: bool) -> AttentionMap:
    """Cut example ``b`` out of ``[batch, layer, head, query, key]``, real tokens only."""
    batch, _, _, q_len, k_len = pattern.shape
    q_valid, q_tokens = call.positions_of(sites[0].side, batch, q_len)
    k_valid, k_tokens = call.positions_of(sites[0].key_side, batch, k_len)
    q_valid, k_valid = q_valid[b], k_valid[b]
    q_cut, k_cut = _cut(q_valid), _cut(k_valid)

    def crop(x: torch.Tensor) -> torch.Tensor:
        return x[b][:, :, q_cut][..., k_cut]

    prompt = call.prompt_lengths.get(sites[0].side)
    return AttentionMap(
        pattern=crop(pattern),
        query_tokens=tuple(_tokens(call, sites[0].side, b, q_valid, q_tokens, tokens_of)),
        key_tokens=tuple(_tokens(call, sites[0].key_side, b, k_valid, k_tokens, tokens_of)),
        layers=tuple(s.layer for s in sites),
        heads=heads,
        scores=None if scores is None else crop(scores),
        kind=sites[0].kind,
        stack=sites[0].stack,
        info=info,
        example_id=example_id,
        check_rows=not edited,
        prompt_length=None if prompt is None else int(prompt[b]),
    )


def build_maps(calls: Sequence[ForwardCall], kept_heads: dict[Site, tuple[int, ...]],
               edited_sites: set[Site], info: ModelInfo, tokens_of: TokensOf | None,
               example_ids: Sequence[str] | None = None,
               originals: Sequence[ForwardCall] = ()) -> list[AttentionMap]:
    """Per call, per example, per (stack, kind): one padding-stripped AttentionMap.

    Each group's layers are stacked once per call, examples are cut out with slices when
    their tokens are contiguous, and the per-layer tensors are released once all is built
    (those of ``originals`` too: the calls before decoding steps were folded into
    ``calls``). A call folded from decoding steps gives maps over the prompt and the tokens
    fed after it, with ``prompt_length`` set.
    """
    maps: list[AttentionMap] = []
    n_example = 0
    for call in calls:
        groups = _groups(call)
        stacked = {key: _stack_group(call, sites) for key, sites in groups.items()}
        batch = next(iter(stacked.values()))[0].shape[0] if stacked else 0
        for b in range(batch):
            example_id = (example_ids[n_example] if example_ids and n_example < len(example_ids)
                          else str(n_example))
            n_example += 1
            for key, sites in groups.items():
                pattern, scores = stacked[key]
                maps.append(_example_map(call, sites, b, pattern, scores, info, tokens_of,
                                         example_id, heads=kept_heads[sites[0]],
                                         edited=any(s in edited_sites for s in sites)))
    for call in (*calls, *originals):
        call.patterns.clear()
        call.scores.clear()
    return maps
