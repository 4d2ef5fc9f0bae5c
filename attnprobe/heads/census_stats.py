"""Every census statistic of one block of rows, in a handful of tensor operations.

The census needs about thirty numbers per head. Computed one reducer at a time they cost as
much as the forward pass itself, so :class:`CensusStats` builds two feature tensors and
reads everything off them:

* ``key features`` ``[batch, key, f]``: first token, each special-token role, all special
  tokens, punctuation, content (non-special) — one batched matmul gives every row's mass on
  each feature;
* ``pair features`` ``[batch, query, key, g]``: same token (duplicate), previous token
  matches (induction), earlier / later, own segment — one more batched matmul;
* relative offsets are scattered into bins, and row entropies and maxima come from one pass;
* sink keys and every statistic judged on the mass left after them (:mod:`.sinks`).

Statistic names are documented in :mod:`attnprobe.heads.scores`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnprobe.core.display import counted, describe
from attnprobe.core.divergence import entropy
from attnprobe.core.reducers import REDUCERS, RowBlock, Sums
from attnprobe.heads.sinks import SinkRule, aligned, sink_sums, sink_view

PARTS = frozenset({"rows", "offsets", "sinks", "classes", "match", "segments"})
ID_FREE_PARTS = frozenset({"rows", "offsets", "sinks"})  # computed without token ids
START_ROLES = ("bos", "cls")  # start tokens: sink keys wherever they stand
_EMPTY = torch.empty(0, dtype=torch.long)


def _previous_ids(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``[batch, key]``: the id of the real token before each key (-1 for the first/padding)."""
    shifted = torch.roll(ids, 1, dims=-1)
    real_before = torch.roll(pos, 1, dims=-1) == pos - 1
    return torch.where((pos >= 1) & real_before, shifted, torch.full_like(ids, -1))


def _segments(key_ids: torch.Tensor, real: torch.Tensor, separators: torch.Tensor
              ) -> torch.Tensor:
    """``[batch, key]`` segment index; a separator closes the segment it ends."""
    is_sep = (torch.isin(key_ids, separators) & real).long()
    return torch.cumsum(is_sep, -1) - is_sep


def _offset_mass_by_diagonals(weights: torch.Tensor, rows: torch.Tensor
                              ) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Mass per head and offset when real tokens sit at their own index.

    ``weights`` ``[batch, head, n, n]`` (padding keys zeroed), ``rows`` ``[batch, 1, n]``.
    The valid rows are summed over the batch first (one pass over the weights); offsets are
    then diagonals of that ``[head, n, n]`` sum, read through a skewed view.
    Returns the lowest offset, ``[head, offsets]`` and ``[head]`` distance sums (float64).
    """
    n = weights.shape[-1]
    summed = torch.einsum("bhij,bi->hij", weights, rows[:, 0].to(weights)).to(torch.float64)
    index = torch.arange(n, device=weights.device)
    distance = (summed * (index[None, :] - index[:, None]).abs()).sum((1, 2))
    width = 3 * n - 2
    padded = torch.nn.functional.pad(summed, (n - 1, n - 1)).contiguous()
    # [head, i, m] = summed[head, i, i + m - (n - 1)]
    skewed = padded.as_strided((summed.shape[0], n, 2 * n - 1), (n * width, width + 1, 1))
    return -(n - 1), skewed.sum(1), distance


def _offset_mass_by_scatter(weights: torch.Tensor, rows: torch.Tensor, rel: torch.Tensor,
                            bounds: tuple[int, int], top_key: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same for any positions (left padding, KV cache, cross-attention), by scattering
    each weight into its offset's bin, offsets clamped into ``bounds`` (the end bins take
    everything beyond them); also the offset bin of each row's argmax. Returns
    ``[head, bins]`` masses, ``[head]`` distance sums (float64) and ``[batch, head, query]``
    argmax bins."""
    batch, n_heads, q_len, k_len = weights.shape
    lo, hi = bounds
    bins = (rel.clamp(lo, hi) - lo)[:, None].expand(batch, n_heads, q_len, k_len)
    profile = weights.new_zeros(batch, n_heads, q_len, hi - lo + 1).scatter_add_(-1, bins,
                                                                                 weights)
    mass = torch.where(rows[..., None], profile, 0.0).sum(dim=(0, 2), dtype=torch.float64)
    per_row = torch.einsum("bhqk,bqk->bhq", weights, rel.abs().to(weights))
    distance = torch.where(rows, per_row, 0.0).sum(dim=(0, 2), dtype=torch.float64)
    top = torch.gather(bins, -1, top_key[..., None])[..., 0]
    return mass, distance, top


def _offset_range(block: RowBlock) -> tuple[int, int] | None:
    """Lowest and highest offset ``key - query`` between a valid row and a real key of the
    block (None without such a pair), from the positions alone (no ``[query, key]`` pass)."""
    big = 1 << 40
    real = block.real_keys()
    rows = block.query_valid
    has = real.any(-1) & rows.any(-1)
    if not bool(has.any()):
        return None
    key_lo = torch.where(real, block.key_pos, big).amin(-1)
    key_hi = torch.where(real, block.key_pos, -big).amax(-1)
    query_lo = torch.where(rows, block.query_pos, big).amin(-1)
    query_hi = torch.where(rows, block.query_pos, -big).amax(-1)
    return int((key_lo - query_hi)[has].min()), int((key_hi - query_lo)[has].max())


def _pool_bins(lo: int, mass: torch.Tensor, top: torch.Tensor, bounds: tuple[int, int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Masses ``[head, bins]`` from offset ``lo`` on, and argmax bins, re-binned into
    ``bounds`` (offsets beyond them added into the end bins)."""
    first, last = bounds
    offsets = torch.arange(lo, lo + mass.shape[1], device=mass.device)
    index = offsets.clamp(first, last) - first
    pooled = mass.new_zeros(mass.shape[0], last - first + 1).index_add_(1, index, mass)
    return pooled, (top + lo).clamp(first, last) - first


@REDUCERS.register("census")
@dataclass(frozen=True, eq=False)
class CensusStats:
    """The census reducer (see the module docstring).

    Args:
        classes: token class -> ids, from :func:`attnprobe.core.tokens.token_classes`; empty
            without a tokenizer.
        max_offset: offsets beyond ±max_offset are pooled into ``offset@far``/``argmax@far``.
        parts: which groups of statistics to compute (``PARTS``); ``classes``, ``match`` and
            ``segments`` need token ids in the blocks (``sinks`` uses them for the start
            tokens when present).
        prefix: prepended to the token-match names (``rep_`` for the repeated-token probe).
        sinks: how column sinks are found (:class:`~attnprobe.heads.sinks.SinkRule`).
    """

    classes: dict[str, torch.Tensor] = field(default_factory=dict)
    max_offset: int | None = None
    parts: frozenset[str] = PARTS
    prefix: str = ""
    sinks: SinkRule = field(default_factory=SinkRule)
    name: str = "census"

    def __repr__(self) -> str:
        return describe("CensusStats", ", ".join(sorted(self.parts)),
                        counted(len(self.classes), "token class", "token classes"),
                        f"max offset {self.max_offset}" if self.max_offset else "every offset",
                        f"prefix {self.prefix!r}" if self.prefix else None)

    def __call__(self, block: RowBlock) -> dict[str, Sums]:
        a = block.pattern.float()
        parts = self.parts if self.classes or block.key_ids is not None else \
            self.parts & ID_FREE_PARTS
        out: dict[str, Sums] = {}
        rel = (block.key_pos[:, None, :] - block.query_pos[:, :, None]).to(a.device)
        real = (block.real_keys()[:, None, :] & block.query_valid[:, :, None]).to(a.device)
        view = None
        if "sinks" in parts and real.any():
            starts = [self.classes[role] for role in START_ROLES if role in self.classes]
            view = sink_view(block, a, torch.cat(starts) if starts else None, self.sinks)
        if parts & {"rows", "offsets"}:  # one pass for both maxima when the sinks are known
            top_weight, top_key = a.max(-1) if view is None else view.raw_top()
        h = entropy(a) if parts & {"rows", "sinks"} else None  # [batch, head, q]
        if "rows" in parts:
            out.update(self._rows(block, a, top_weight, h))
        if "offsets" in parts and real.any():
            out.update(self._offsets(block, a, rel, real, top_key))
        if view is not None:
            out.update(sink_sums(block, a, rel, view, self.sinks, self.max_offset,
                                 row_entropy=h))
        if parts & {"classes", "match", "segments"}:
            if block.query_ids is None or block.key_ids is None:
                block.require_ids("token-class, duplicate/induction and block")
            out.update(self._tokens(block, a, rel, parts))
        return out

    # ------------------------------------------------------------------------ rows
    @staticmethod
    def _rows(block: RowBlock, a: torch.Tensor, top_weight: torch.Tensor, h: torch.Tensor
              ) -> dict[str, Sums]:
        visible = block.visible_keys().to(a.device, torch.float32)[:, None, :]
        several = (visible > 1) & block.query_valid[:, None, :].to(a.device)
        normed = torch.where(several, h / visible.clamp(min=2).log(), 0.0)
        n_heads = a.shape[1]
        return {
            "entropy": block.masked_row_sum(h),
            "entropy_norm": (normed.sum(dim=(0, 2), dtype=torch.float64),
                             several.sum(dim=(0, 2)).to(torch.float64).expand(n_heads)),
            "chance_weight": block.masked_row_sum((1 / visible).expand_as(h)),
            "max_weight": block.masked_row_sum(top_weight),
        }

    # --------------------------------------------------------------------- offsets
    def _offsets(self, block: RowBlock, a: torch.Tensor, rel: torch.Tensor,
                 real: torch.Tensor, top_key: torch.Tensor) -> dict[str, Sums]:
        n_heads = a.shape[1]
        span = _offset_range(block)
        if span is None:
            return {}
        limit = self.max_offset
        # one bin per offset seen; with a limit, offsets beyond it share the end bins (far)
        bounds = span if limit is None else (max(span[0], -limit - 1), min(span[1], limit + 1))
        weights = a * real[:, None].to(a)
        rows = block.query_valid[:, None, :].to(a.device)  # [batch, 1, q]
        if aligned(block):
            lo, mass, distance = _offset_mass_by_diagonals(weights, rows)
            top = top_key - torch.arange(a.shape[2], device=a.device) - lo
            mass, top = _pool_bins(lo, mass, top, bounds)
        else:
            mass, distance, top = _offset_mass_by_scatter(weights, rows, rel, bounds, top_key)
        n_bins = mass.shape[1]
        heads = torch.arange(n_heads, device=a.device)[None, :, None]
        valid = rows.expand_as(top)
        shares = torch.bincount((top + n_bins * heads)[valid], minlength=n_heads * n_bins)
        shares = shares.view(n_heads, n_bins).to(torch.float64)
        out: dict[str, Sums] = {"distance": distance}
        for b in range(n_bins):
            offset = bounds[0] + b
            label = "far" if limit is not None and abs(offset) > limit else f"{offset:+d}"
            for stat, values in ((f"offset@{label}", mass), (f"argmax@{label}", shares)):
                out[stat] = out[stat] + values[:, b] if stat in out else values[:, b]
        return out

    # ---------------------------------------------------------------------- tokens
    def _tokens(self, block: RowBlock, a: torch.Tensor, rel: torch.Tensor,
                parts: frozenset[str]) -> dict[str, Sums]:
        q_ids, k_ids = block.query_ids.to(a.device), block.key_ids.to(a.device)
        real = block.real_keys().to(a.device)
        special = self.classes.get("special", _EMPTY).to(a.device)
        content = real & ~torch.isin(k_ids, special)  # [batch, key]
        out: dict[str, Sums] = {}
        if "classes" in parts:
            features = [(block.key_pos == 0).to(a.device) & real]
            features += [torch.isin(k_ids, ids.to(a.device)) & real
                         for ids in self.classes.values()]
            masses = torch.einsum("bhqk,bkf->bhqf", a, torch.stack(features, -1).to(a))
            for i, name in enumerate(["first", *self.classes]):
                out[name] = block.masked_row_sum(masses[..., i])
        if parts & {"match", "segments"}:
            out.update(self._pairs(block, a, rel, q_ids, k_ids, real, content, special, parts))
        return out

    def _pairs(self, block: RowBlock, a: torch.Tensor, rel: torch.Tensor, q_ids: torch.Tensor,
               k_ids: torch.Tensor, real: torch.Tensor, content: torch.Tensor,
               special: torch.Tensor, parts: frozenset[str]) -> dict[str, Sums]:
        """Masses on query-key pair patterns, renormalised over the pattern's key set."""
        content_row = block.query_valid.to(a.device) & ~torch.isin(q_ids, special)
        keys = content[:, None, :].expand_as(rel)  # [batch, q, key]
        # name -> (pattern [batch, q, key], keys it is renormalised over, extra row condition)
        patterns: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        if "match" in parts:
            same = q_ids[:, :, None] == k_ids[:, None, :]
            follows = q_ids[:, :, None] == _previous_ids(k_ids, block.key_pos.to(a.device))[
                :, None, :]
            earlier, later = rel < 0, rel > 0
            p = self.prefix
            patterns[p + "prev"] = (rel == -1, keys, None)
            patterns[p + "duplicate"] = (same & earlier, keys, None)
            patterns[p + "induction"] = (follows & earlier & (rel != -1), keys, None)
            patterns[p + "duplicate_ahead"] = (same & later, keys, None)
            patterns[p + "induction_ahead"] = (follows & later & (rel != 1), keys, None)
        segment = _segments(k_ids, real, self.classes["sep"].to(a.device)) \
            if "segments" in parts and "sep" in self.classes else None
        n_segments = torch.where(content, segment, -1).amax(-1) + 1 \
            if segment is not None else None  # [batch]
        if n_segments is not None and int(n_segments.max()) >= 2:  # some input is a pair
            at = (block.key_pos[:, None, :] == block.query_pos[:, :, None]).to(a.device) & \
                real[:, None, :]
            q_segment = (at.long() * torch.where(real, segment, 0)[:, None, :]).sum(-1)
            far = keys & (rel.abs() > 1)
            own = segment[:, None, :] == q_segment[:, :, None]
            patterns["block"] = (own, far, (n_segments >= 2)[:, None].expand_as(q_segment))
        if not patterns:
            return {}
        # distinct key sets to renormalise over (content keys, far content keys)
        bases = list({id(k): k for _, k, _ in patterns.values()}.values())
        base_of = [next(b for b, k in enumerate(bases) if k is keys_) for _, keys_, _ in
                   patterns.values()]
        hits = [p & k for p, k, _ in patterns.values()]
        pair = torch.stack(hits + bases, -1).to(a)  # [batch, q, key, g]
        mass = torch.einsum("bhqk,bqkg->bhqg", a, pair)
        n_hits = len(hits)
        out: dict[str, Sums] = {}
        n_heads = a.shape[1]
        for i, (name, (_, _, condition)) in enumerate(patterns.items()):
            base = mass[..., n_hits + base_of[i]]
            present = bases[base_of[i]] if name == "block" else hits[i]
            rows = content_row & present.any(-1)
            if condition is not None:
                rows = rows & condition
            counted = rows[:, None, :] & (base > 0)  # [batch, head, q]
            share = mass[..., i] / base.clamp(min=1e-30)
            sums = torch.where(counted, share, 0.0).sum(dim=(0, 2), dtype=torch.float64)
            counts = counted.sum(dim=(0, 2)).to(torch.float64)
            out[name] = (sums, counts if counts.shape[0] == n_heads else counts.expand(n_heads))
        return out
