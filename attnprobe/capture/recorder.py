"""What every capture seam shares: selection, editing, streaming reducers and map assembly.

A seam (HF attention function, forward hooks on module paths) hands the recorder each
layer's post-softmax weights as ``[batch, head, query, key]`` blocks. The recorder keeps the
requested heads, feeds reducers, applies edits, and turns what it kept into per-example
:class:`~attnprobe.types.AttentionMap` objects with padding stripped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch

from attnprobe.capture.calls import (
    BatchPatterns,
    ForwardCall,
    Side,
    StopForward,
)
from attnprobe.capture.sites import Site
from attnprobe.errors import EditNotAppliedError, HookNotFiredError, InputError
from attnprobe.heads.reducers import Reducer, RowBlock, Tally
from attnprobe.types import AttentionMap, ModelInfo

EditFn = Callable[[int, torch.Tensor], torch.Tensor]


def _check_indices(name: str, wanted: Sequence[int] | None) -> tuple[int, ...] | None:
    if wanted is None:
        return None
    wanted = (wanted,) if isinstance(wanted, int) else tuple(wanted)
    if not wanted:
        raise InputError(f"{name} must not be empty; pass None for all")
    bad = [w for w in wanted if not isinstance(w, int) or isinstance(w, bool) or w < 0]
    if bad:
        raise InputError(f"{name} must be non-negative integers; got {bad}")
    return tuple(sorted(set(wanted)))


class Recorder:
    """Per-context state of one capture (never stored on the model)."""

    def __init__(self, *, layers: Sequence[int] | None, heads: Sequence[int] | None,
                 keep: bool, reducers: Sequence[Reducer] | None, edit: EditFn | None,
                 query_block: int | None = None, live: bool = False,
                 values: bool = False, edit_output: EditFn | None = None) -> None:
        self.layers = _check_indices("layers", layers)
        self.heads = _check_indices("heads", heads)
        self.keep = keep
        self.reducers = list(reducers or [])
        self.edit = edit
        self.query_block = query_block
        self.live = live
        self.values = values
        self.edit_output = edit_output
        self.stop_after: Site | None = None  # raise StopForward once this site is read
        self.tally = Tally()
        self.calls: list[ForwardCall] = []
        self.fired: set[Site] = set()
        self.edit_changes: dict[Site, float] = {}
        self.kept_heads: dict[Site, tuple[int, ...]] = {}
        self.n_heads = 0  # heads of the model, seen on the first captured tensor
        self.n_layers = 0  # most layers of any stack, known before the forward

    # ------------------------------------------------------------ selection
    @property
    def needs_weights(self) -> bool:
        return self.keep or bool(self.reducers) or self.edit is not None or self.live \
            or self.values or self.edit_output is not None

    @property
    def needs_whole(self) -> bool:
        """Whether a seam must hand over all query rows at once (no row blocks)."""
        return self.keep or self.edit is not None or self.live or self.values \
            or self.edit_output is not None

    def wants(self, site: Site) -> bool:
        return self.layers is None or site.layer in self.layers

    def head_index(self, n_heads: int, site: Site) -> tuple[int, ...]:
        if self.heads is None:
            return tuple(range(n_heads))
        bad = [h for h in self.heads if h >= n_heads]
        if bad:
            bad = bad[:5] + (["..."] if len(bad) > 5 else [])
            raise InputError(f"heads {bad} out of range at {site.path}: it has {n_heads} heads "
                             f"(0..{n_heads - 1})")
        return self.heads

    def check_layers(self, counts: dict[tuple[str, str], int]) -> None:
        """Raise before any forward when a requested layer exists in no stack."""
        self.n_layers = max(counts.values(), default=0)
        if self.layers is None or not counts:
            return
        bad = [layer for layer in self.layers if layer >= self.n_layers]
        if bad:
            bad = bad[:5] + (["..."] if len(bad) > 5 else [])
            stacks = ", ".join(f"{s or 'model'} ({k}): 0..{n - 1}" for (s, k), n in counts.items())
            raise InputError(f"layers {bad} out of range; layers are {stacks}")

    # -------------------------------------------------------------- calls
    def begin_call(self, ids: dict[Side, torch.Tensor | None],
                   valid: dict[Side, torch.Tensor | None]) -> None:
        """Note one forward's inputs; with a KV cache, prepend the ids seen so far."""
        for _side, mask in valid.items():
            if mask is not None and mask.ndim == 2 and not mask.any(-1).all():
                empty = (~mask.any(-1)).nonzero().flatten().tolist()
                raise InputError(f"examples {empty} have no real tokens: every query row is "
                                 "fully masked")
        fresh = {side: t.shape[-1] for side, t in ids.items() if t is not None}
        if self.calls:
            for side, current in ids.items():
                past, mask = self.calls[-1].ids.get(side), valid.get(side)
                if (current is not None and past is not None and mask is not None
                        and past.shape[0] == current.shape[0]
                        and past.shape[1] + current.shape[1] == mask.shape[1]):
                    ids[side] = torch.cat([past, current], dim=1)
        self.calls.append(ForwardCall(ids=ids, valid=valid, fresh=fresh))

    @property
    def current(self) -> ForwardCall:
        if not self.calls:  # a seam fired without the root pre-hook (e.g. a submodule was called)
            self.calls.append(ForwardCall(ids={}, valid={}))
        return self.calls[-1]

    def query_valid(self, site: Site, batch: int, q_len: int) -> torch.Tensor:
        return self.current.valid_mask(site.side, batch, q_len)

    # ------------------------------------------------------------ consume
    def apply_edit(self, site: Site, pattern: torch.Tensor) -> torch.Tensor:
        """Run the caller's edit on ``[batch, head, query, key]``; check shape and finiteness."""
        assert self.edit is not None  # noqa: S101 - guarded by callers
        return self._checked(site, pattern, self.edit(site.layer, pattern), "edit")

    def apply_output_edit(self, site: Site, output: torch.Tensor) -> torch.Tensor:
        """Run the caller's output edit on the per-head outputs ``[batch, head, query, d]``
        (the weights times the values, before the output projection)."""
        assert self.edit_output is not None  # noqa: S101 - guarded by callers
        return self._checked(site, output, self.edit_output(site.layer, output), "edit_output")

    def _checked(self, site: Site, before: torch.Tensor, edited: Any, what: str) -> torch.Tensor:
        if not isinstance(edited, torch.Tensor) or edited.shape != before.shape:
            got = tuple(edited.shape) if isinstance(edited, torch.Tensor) else type(edited).__name__
            raise InputError(f"{what} at {site.path} must return a tensor of shape "
                             f"{tuple(before.shape)}; got {got}")
        if not torch.isfinite(edited).all():
            raise InputError(f"{what} at {site.path} returned NaN or inf")
        edited = edited.to(before.dtype)
        change = (edited - before).abs().max().item() if before.numel() else 0.0
        self.edit_changes[site] = max(self.edit_changes.get(site, 0.0), change)
        return edited

    def consume_values(self, site: Site, value: torch.Tensor, n_heads: int) -> None:
        """Keep the value vectors ``[batch, kv_head, key, d]`` of a site, one per query head
        (key/value heads repeated for grouped-query attention)."""
        groups = n_heads // value.shape[1]
        value = value.detach()
        self.current.values[site] = value.repeat_interleave(groups, 1) if groups > 1 else value

    def consume_scores(self, site: Site, scores: torch.Tensor) -> None:
        """Keep pre-softmax scores ``[batch, head, query, key]`` of a site (hook points only)."""
        heads = self.head_index(scores.shape[1], site)
        kept = scores[:, list(heads)].detach().to("cpu", torch.float32)
        self.current.scores[site] = _append_rows(self.current.scores.get(site), kept, site)

    def consume(self, site: Site, pattern: torch.Tensor, q_start: int = 0,
                q_total: int | None = None, visible: torch.Tensor | None = None) -> None:
        """Take a block of rows ``[batch, head, q_block, key]`` starting at query ``q_start``.

        ``visible`` (``[batch|1, q_block]``): how many keys each row was allowed to attend to,
        from the seam's mask; estimated from the weights when the seam cannot know it.
        """
        self.fired.add(site)
        n_heads = pattern.shape[1]
        self.n_heads = max(self.n_heads, n_heads)
        heads = self.head_index(n_heads, site)
        kept = pattern if len(heads) == n_heads else pattern[:, list(heads)]
        if self.reducers:
            self._reduce(site, heads, kept, pattern, q_start, q_total or pattern.shape[2], visible)
        self._keep(site, heads, kept, pattern)
        if self.stop_after == site and q_start + pattern.shape[2] >= (q_total or 0):
            raise StopForward

    def _keep(self, site: Site, heads: tuple[int, ...], kept: torch.Tensor,
              pattern: torch.Tensor) -> None:
        if self.live:
            if pattern.requires_grad:
                pattern.retain_grad()
            self.current.live[site] = pattern
        if self.keep:
            self.kept_heads[site] = heads
            kept = kept.detach().to("cpu", torch.float32)
            self.current.patterns[site] = _append_rows(self.current.patterns.get(site), kept, site)

    def _reduce(self, site: Site, heads: tuple[int, ...], kept: torch.Tensor,
                pattern: torch.Tensor, q_start: int, q_total: int,
                visible: torch.Tensor | None) -> None:
        call = self.current
        batch, _, q_block, k_len = pattern.shape
        q_valid, q_pos, q_ids = call.token_view(site.side, batch, q_total)
        k_valid, k_pos, k_ids = call.token_view(site.key_side, batch, k_len)
        rows = slice(q_start, q_start + q_block)
        real_rows = q_valid[:, None, rows].to(kept.device)
        if not torch.isfinite(kept.sum(-1)).logical_or(~real_rows).all():
            raise InputError(f"a real query row at {site.path} has NaN or inf weights "
                             "(fully masked?)")
        if visible is None:  # keys any head gave weight to; exact unless every head underflows
            seen = (pattern.detach() > 0).any(1) & k_valid[:, None, :].to(pattern.device)
            visible = seen.sum(-1)
        block = RowBlock(pattern=kept.detach(), query_valid=q_valid[:, rows],
                         query_pos=q_pos[:, rows], key_pos=k_pos,
                         key_len=k_valid.sum(-1).clamp(min=1),
                         visible=visible.expand(batch, q_block).cpu(),
                         query_ids=None if q_ids is None else q_ids[:, rows], key_ids=k_ids)
        self.tally.add(site.key, heads, block, self.reducers)

    # ------------------------------------------------------------- finish
    def finish(self, wanted_sites: Sequence[Site]) -> None:
        """After a clean exit: every wanted site fired, every edit changed something."""
        if not self.calls:
            raise HookNotFiredError("the model was never called inside the capture context")
        missing = [s.path for s in wanted_sites if s not in self.fired]
        if missing and self.needs_weights:
            raise HookNotFiredError(f"attention at {', '.join(missing)} never ran; check the "
                                    "paths/layers or that the model calls these modules")
        edits = self.edit is not None or self.edit_output is not None
        if edits and not any(v > 0 for v in self.edit_changes.values()):
            raise EditNotAppliedError("the edit left every attention pattern unchanged "
                                      f"(layers {sorted({s.layer for s in self.fired})})")

    def edits_frame(self) -> pd.DataFrame:
        rows = [(s.stack, s.kind, s.layer, s.path, c) for s, c in self.edit_changes.items()]
        return pd.DataFrame(rows, columns=["stack", "kind", "layer", "path", "max_abs_change"])

    def batch_patterns(self) -> list[BatchPatterns]:
        """Per call and (stack, kind): the kept weights, still padded (no per-example cuts)."""
        out = []
        for call in self.calls:
            groups: dict[tuple[str, str], list[Site]] = {}
            for site in sorted(call.patterns, key=lambda s: s.layer):
                groups.setdefault((site.stack, site.kind), []).append(site)
            for (stack, kind), sites in groups.items():
                pattern, _ = _stack_group(call, sites)
                batch, _, _, q_len, k_len = pattern.shape
                q_valid, _, q_ids = call.token_view(sites[0].side, batch, q_len)
                k_valid, _, k_ids = call.token_view(sites[0].key_side, batch, k_len)
                out.append(BatchPatterns(pattern=pattern, query_valid=q_valid, key_valid=k_valid,
                                         query_ids=q_ids, key_ids=k_ids,
                                         layers=tuple(s.layer for s in sites),
                                         heads=self.kept_heads[sites[0]], stack=stack, kind=kind))
        return out

    def build_maps(self, info: ModelInfo, tokens_of: Callable[[torch.Tensor], list[str]] | None,
                   example_ids: Sequence[str] | None = None) -> list[AttentionMap]:
        """Per call, per example, per (stack, kind): one padding-stripped AttentionMap.

        Each group's layers are stacked once per call, examples are cut out with slices when
        their tokens are contiguous, and the per-layer tensors are released once all is built.
        """
        maps: list[AttentionMap] = []
        n_example = 0
        for call in self.calls:
            groups: dict[tuple[str, str], list[Site]] = {}
            for site in sorted(call.patterns, key=lambda s: s.layer):
                groups.setdefault((site.stack, site.kind), []).append(site)
            stacked = {key: _stack_group(call, sites) for key, sites in groups.items()}
            batch = next(iter(stacked.values()))[0].shape[0] if stacked else 0
            for b in range(batch):
                example_id = (example_ids[n_example] if example_ids and n_example < len(example_ids)
                              else str(n_example))
                n_example += 1
                for key, sites in groups.items():
                    pattern, scores = stacked[key]
                    maps.append(_example_map(call, sites, b, pattern, scores, info, tokens_of,
                                             example_id, heads=self.kept_heads[sites[0]],
                                             edited=any(s in self.edit_changes for s in sites)))
        for call in self.calls:
            call.patterns.clear()
            call.scores.clear()
        return maps


def _append_rows(earlier: torch.Tensor | None, rows: torch.Tensor, site: Site) -> torch.Tensor:
    """Rows of a site that ran again in the same forward.

    A step-by-step decoder (one query row per step over the same keys) gets its rows appended
    along the query axis; anything else (e.g. one layer shared across depths) is ambiguous.
    """
    if earlier is None:
        return rows
    if rows.shape[2] != 1 or earlier.shape[:2] != rows.shape[:2] \
            or earlier.shape[3] != rows.shape[3]:
        raise InputError(f"{site.path} ran more than once in one forward with shapes "
                         f"{tuple(earlier.shape)} and {tuple(rows.shape)}; capture one call "
                         "per forward")
    return torch.cat([earlier, rows], dim=2)


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


def _cut(valid: torch.Tensor) -> slice | torch.Tensor:
    """Index of the real tokens: a slice when they are contiguous (left/right padding)."""
    where = valid.nonzero().flatten()
    first, last = int(where[0]), int(where[-1])
    return slice(first, last + 1) if last - first + 1 == len(where) else valid


def _tokens(call: ForwardCall, side: Side, b: int, valid: torch.Tensor, are_tokens: bool,
            tokens_of: Callable[[torch.Tensor], list[str]] | None) -> list[str]:
    ids = call.ids.get(side)
    if not are_tokens:  # e.g. learned pooling queries
        return [f"[query {i}]" for i in range(int(valid.sum()))]
    if ids is None or ids.shape[-1] < valid.shape[-1]:
        return [f"[{i}]" for i in range(int(valid.sum()))]
    real = ids[b, ids.shape[-1] - valid.shape[-1]:][valid]
    return tokens_of(real) if tokens_of else [str(int(i)) for i in real]


def _example_map(call: ForwardCall, sites: list[Site], b: int, pattern: torch.Tensor,
                 scores: torch.Tensor | None, info: ModelInfo, tokens_of: Any, example_id: str,
                 *, heads: tuple[int, ...], edited: bool) -> AttentionMap:
    """Cut example ``b`` out of ``[batch, layer, head, query, key]``, real tokens only."""
    batch, _, _, q_len, k_len = pattern.shape
    q_valid, q_tokens = call.positions_of(sites[0].side, batch, q_len)
    k_valid, k_tokens = call.positions_of(sites[0].key_side, batch, k_len)
    q_valid, k_valid = q_valid[b], k_valid[b]
    q_cut, k_cut = _cut(q_valid), _cut(k_valid)

    def crop(x: torch.Tensor) -> torch.Tensor:
        return x[b][:, :, q_cut][..., k_cut]

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
    )
