"""From what a capture kept to results: padded batches and padding-stripped maps.

The recorder stores each forward call's kept weights per site (:class:`ForwardCall`); here
they are grouped by attention stack and stacked once per call (:func:`stack_calls`, which
releases the per-site tensors), then handed over still padded (:func:`batch_patterns`) or
cut into one :class:`~attnprobe.types.AttentionMap` per example (:func:`build_maps`). Both
read the same stacked tensors (the maps are views of them), so asking for both costs no copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from attnprobe.capture.calls import BatchPatterns, ForwardCall, Side
from attnprobe.capture.extra_keys import ExtraKeys, extra_key_view
from attnprobe.capture.sites import Site
from attnprobe.core.divergence import row_sum_tolerance
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, ModelInfo

__all__ = ["Stacked", "batch_patterns", "build_maps", "stack_calls"]

TokensOf = Callable[[torch.Tensor], list[str]]


Group = tuple[str, str, tuple[int, ...]]  # (stack, kind, [head, query, key] shape)


def _groups(call: ForwardCall) -> dict[Group, list[Site]]:
    """The call's kept sites by (stack, kind), in layer order. Layers whose weights differ
    in shape (their own head count, or keys of their own, as in hybrid models) are kept
    apart, one group per shape, so that each group stacks into one array."""
    groups: dict[Group, list[Site]] = {}
    for site in sorted(call.patterns, key=lambda s: s.layer):
        shape = tuple(call.patterns[site].shape[1:])
        groups.setdefault((site.stack, site.kind, shape), []).append(site)
    return groups


def _stack_group(call: ForwardCall, sites: list[Site]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[batch, layer, head, query, key]`` of one group, and its scores if kept."""
    pattern = torch.stack([call.patterns[s] for s in sites], dim=1)
    scores = None
    if all(s in call.scores for s in sites):
        scores = torch.stack([call.scores[s] for s in sites], dim=1)
    return pattern, scores


@dataclass(frozen=True)
class Stacked:
    """One group of one forward call: its sites (one per layer) and their weights
    ``[batch, layer, head, query, key]`` (and scores, if kept), padding included."""

    call: ForwardCall
    sites: list[Site]
    pattern: torch.Tensor
    scores: torch.Tensor | None


def stack_calls(calls: Sequence[ForwardCall],
                originals: Sequence[ForwardCall] = ()) -> list[Stacked]:
    """Every call's kept weights stacked per group, in call order; the per-site tensors of
    ``calls`` and ``originals`` (the calls before decoding steps were folded) are released."""
    out = []
    for call in calls:
        for sites in _groups(call).values():
            pattern, scores = _stack_group(call, sites)
            out.append(Stacked(call, sites, pattern, scores))
    for call in (*calls, *originals):
        call.patterns.clear()
        call.scores.clear()
    return out


def batch_patterns(stacked: Sequence[Stacked], kept_heads: dict[Site, tuple[int, ...]],
                   sink_sites: frozenset[Site] = frozenset()) -> list[BatchPatterns]:
    """Per call and group: the kept weights, still padded (no per-example cuts)."""
    out = []
    for group in stacked:
        call, sites, pattern = group.call, group.sites, group.pattern
        batch, _, _, q_len, k_len = pattern.shape
        q_valid, _, q_ids = call.token_view(sites[0].side, batch, q_len)
        k_valid, _, k_ids = call.token_view(sites[0].key_side, batch, k_len)
        out.append(BatchPatterns(pattern=pattern, query_valid=q_valid, key_valid=k_valid,
                                 query_ids=q_ids, key_ids=k_ids,
                                 layers=tuple(s.layer for s in sites),
                                 heads=kept_heads[sites[0]], stack=sites[0].stack,
                                 kind=sites[0].kind,
                                 learned_sink=any(s in sink_sites for s in sites)))
    return out


def _cut(valid: torch.Tensor) -> slice | torch.Tensor:
    """Index of the real tokens: a slice when they are contiguous (left/right padding)."""
    where = valid.nonzero().flatten()
    first, last = int(where[0]), int(where[-1])
    return slice(first, last + 1) if last - first + 1 == len(where) else valid


def _tokens(call: ForwardCall, side: Side, b: int, valid: torch.Tensor, are_tokens: bool,
            tokens_of: TokensOf | None) -> tuple[list[str], tuple[int, ...] | None]:
    """The token strings of example ``b``'s real positions, and their ids when known."""
    ids = call.ids.get(side)
    if not are_tokens:  # e.g. learned pooling queries
        return [f"[query {i}]" for i in range(int(valid.sum()))], None
    if ids is None or ids.shape[-1] < valid.shape[-1]:
        return [f"[{i}]" for i in range(int(valid.sum()))], None
    real = ids[b, ids.shape[-1] - valid.shape[-1]:][valid]
    found = tuple(int(i) for i in real.tolist())
    return (tokens_of(real) if tokens_of else [str(i) for i in found]), found


def _appended_keys(call: ForwardCall, site: Site, b: int, pattern: torch.Tensor,
                   q_valid: torch.Tensor, extra: Mapping[str, ExtraKeys]
                   ) -> tuple[torch.Tensor, list[str]] | None:
    """Kept keys and names of the appended entries of a layer whose keys go on after the
    tokens (:mod:`attnprobe.capture.extra_keys`); ``None`` for any other layer."""
    kind, mask = extra.get(site.path), call.valid.get(site.key_side)
    if kind is None or mask is None or mask.shape[0] != pattern.shape[0] or call.continues:
        return None
    return extra_key_view(kind, mask[b], pattern[b], q_valid)


def _example_map(call: ForwardCall, sites: list[Site], b: int, pattern: torch.Tensor,
                 scores: torch.Tensor | None, info: ModelInfo, tokens_of: TokensOf | None,
                 example_id: str, *, heads: tuple[int, ...], edited: bool,
                 learned_sink: bool = False,
                 extra: Mapping[str, ExtraKeys] | None = None) -> AttentionMap:
    """Cut example ``b`` out of ``[batch, layer, head, query, key]``, real tokens only."""
    extra = extra or {}
    batch, _, _, q_len, k_len = pattern.shape
    q_valid, q_tokens = call.positions_of(sites[0].side, batch, q_len)
    k_valid, k_tokens = call.positions_of(sites[0].key_side, batch, k_len)
    q_valid, k_valid = q_valid[b], k_valid[b]
    appended = _appended_keys(call, sites[0], b, pattern, q_valid, extra)
    if appended is not None:  # token keys, then entries that are no tokens
        k_valid, extra_names = appended
    q_cut, k_cut = _cut(q_valid), _cut(k_valid)

    def crop(x: torch.Tensor) -> torch.Tensor:
        return x[b][:, :, q_cut][..., k_cut]

    if not edited and not learned_sink:
        _check_padding_unseen(pattern[b][:, :, q_cut], crop(pattern), sites[0], info)
    prompt = call.prompt_lengths.get(sites[0].side)
    query_tokens, query_ids = _tokens(call, sites[0].side, b, q_valid, q_tokens, tokens_of)
    if appended is None:
        key_tokens, key_ids = _tokens(call, sites[0].key_side, b, k_valid, k_tokens, tokens_of)
    else:  # the entries have no token ids: ids only when every key is a token
        mask = call.valid[sites[0].key_side][b]
        key_tokens = _tokens(call, sites[0].key_side, b, mask, True, tokens_of)[0] + extra_names
        key_ids = None
    return AttentionMap(
        pattern=crop(pattern),
        query_tokens=tuple(query_tokens),
        key_tokens=tuple(key_tokens),
        query_ids=query_ids,
        key_ids=key_ids,
        layers=tuple(s.layer for s in sites),
        heads=heads,
        scores=None if scores is None else crop(scores),
        kind=sites[0].kind,
        stack=sites[0].stack,
        info=info,
        example_id=example_id,
        check_rows=not edited,
        prompt_length=None if prompt is None else int(prompt[b]),
        learned_sink=learned_sink,
    )


def _check_padding_unseen(rows: torch.Tensor, real: torch.Tensor, site: Site,
                          info: ModelInfo) -> None:
    """Raise when the model gave real query rows weight on keys the attention mask calls
    padding: ``rows`` ``[layer, head, query, key]`` over every key, ``real`` over real keys.

    Then the model does not read ``attention_mask`` for those keys (some families mask by
    their pad token id instead), and the map over the real keys would not sum to 1.
    """
    leak = (rows.sum(-1) - real.sum(-1)).abs().max().item() if real.numel() else 0.0
    if leak > row_sum_tolerance(info.dtype):
        raise InputError(
            f"the model gave up to {leak:.3g} of a real token's attention at {site.path} to "
            "positions the attention mask marks as padding: it does not mask them (it may "
            "mask by token id: pad with the model's pad_token_id)")


def build_maps(stacked: Sequence[Stacked], kept_heads: dict[Site, tuple[int, ...]],
               edited_sites: set[Site], info: ModelInfo, tokens_of: TokensOf | None,
               example_ids: Sequence[str] | None = None,
               sink_sites: frozenset[Site] = frozenset(),
               extra: Mapping[str, ExtraKeys] | None = None) -> list[AttentionMap]:
    """Per call, per example, per group: one padding-stripped AttentionMap.

    Examples are cut out of the stacked weights with slices when their tokens are contiguous
    (the maps are views of them). A call folded from decoding steps gives maps over the
    prompt and the tokens fed after it, with ``prompt_length`` set. Maps of ``sink_sites``
    (heads with a learned sink) have ``learned_sink`` set: their rows sum to at most 1.
    ``extra``: the layers whose keys go on after the tokens, by module path
    (:func:`attnprobe.capture.extra_keys.extra_keys_of`).
    """
    by_call: dict[int, list[Stacked]] = {}
    for group in stacked:
        by_call.setdefault(id(group.call), []).append(group)
    maps: list[AttentionMap] = []
    n_example = 0
    for groups in by_call.values():
        for b in range(groups[0].pattern.shape[0]):
            example_id = (example_ids[n_example] if example_ids and n_example < len(example_ids)
                          else str(n_example))
            n_example += 1
            for group in groups:
                sites = group.sites
                maps.append(_example_map(group.call, sites, b, group.pattern, group.scores,
                                         info, tokens_of, example_id,
                                         heads=kept_heads[sites[0]],
                                         edited=any(s in edited_sites for s in sites),
                                         learned_sink=any(s in sink_sites for s in sites),
                                         extra=extra))
    return maps
