"""Token matches: how much of a row's content attention goes to the previous token, to an
earlier copy of its own token (duplicate) and to the token after an earlier copy (induction,
Olsson et al.), and the same ahead of the row. Each is renormalised over the row's content
keys (no special token) and averaged over the content rows where the pattern exists, so
the statistic returns ``(sums, counts)``: the copying labels trust a score only over enough
rows (the ``*_rows`` columns).

Matches are read at the matching pairs only (a sparse gather), never through a ``[query,
key, pattern]`` product.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from attnprobe.core.reducers import Sums
from attnprobe.heads.stats.base import SCORES, STATS, Column, Means, Score, Stat, register_means
from attnprobe.heads.tile import Tile

RANK = 50  # place in the tally's statistic order (attnprobe.core.plugins)

COPIES = ("duplicate", "induction", "duplicate_ahead", "induction_ahead")


def following_keys(pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                   key_pos: torch.Tensor, content: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Induction pairs from copy pairs: for each ``(batch, query, key)`` whose key holds the
    query's token, the pair of the query with the content key right after that key (the
    next real token), in the same row-major order. A key whose token is a content query's
    is itself a content token, so these are exactly the keys whose previous token is a copy
    of the query's."""
    b, q, k = pairs
    after = k + 1
    inside = after < key_pos.shape[1]
    b, q, k, after = b[inside], q[inside], k[inside], after[inside]
    keep = (key_pos[b, after] == key_pos[b, k] + 1) & content[b, after]
    return b[keep], q[keep], after[keep]


class Copies(Stat):
    """Names get the tile spec's prefix (``rep_`` on the repeated-token probe)."""

    group: ClassVar[str] = "match"
    needs_ids: ClassVar[bool] = True
    columns: ClassVar[tuple[Column, ...]] = (
        Column("prev", "content mass on the previous token", "own"),
        Column("duplicate", "content mass on earlier copies of the row's token", "own"),
        Column("induction", "content mass on tokens after earlier copies of the row's token "
                            "(not the previous token)", "own"),
        Column("duplicate_ahead", "content mass on later copies of the row's token", "own"),
        Column("induction_ahead", "content mass on tokens after later copies (not the next "
                                  "token)", "own"),
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        block = tile.block
        q_ids, k_ids = (ids.to(tile.device) for ids in block.require_ids(
            "duplicate/induction"))
        content = tile.content  # [batch, key]
        content_row = tile.rows & ~torch.isin(q_ids, tile.spec.special.to(tile.device))
        rows = torch.where(content_row, q_ids, -2)  # -2 matches no key
        key_pos = block.key_pos.to(tile.device)
        query_pos = block.query_pos.to(tile.device)
        prev_present = tile.key_at(content, -1)  # [batch, query]
        hits = {  # name -> ([batch, head, query] mass, [batch, query] pattern present)
            "prev": (tile.at_offset(-1) * prev_present[:, None, :], prev_present)}
        copies = matching_pairs(rows, torch.where(content, k_ids, -1))
        found = {"duplicate": copies, "induction": following_keys(copies, key_pos, content)}
        for kind, (b, q, k) in found.items():
            rel = key_pos[b, k] - query_pos[b, q]
            step = -1 if kind == "induction" else 0  # the previous / next token is no copy
            for name, keep in ((kind, (rel < 0) & (rel != step)),
                               (f"{kind}_ahead", (rel > 0) & (rel != -step))):
                pairs = (b[keep], q[keep], k[keep])
                present = torch.zeros_like(content_row)
                present[pairs[0], pairs[1]] = True
                hits[name] = (tile.mass_on_pairs(pairs), present)
        hits = {name: hits[name] for name in ("prev", *COPIES)}
        base = tile.class_masses["content"]  # [batch, head, query]
        has_base = base > 0
        safe = base.clamp(min=1e-30)
        counted = torch.stack([(content_row & present)[:, None, :] & has_base
                               for _, present in hits.values()])  # [name, batch, head, query]
        sums = tile.row_sums([mass / safe for mass, _ in hits.values()], counted)
        counts = counted.sum(dim=(1, 3), dtype=torch.float64)
        return {tile.spec.prefix + name: (sums[i], counts[i]) for i, name in enumerate(hits)}


def matching_pairs(query: torch.Tensor, key: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(batch, query, key)`` indices of the pairs with ``query[b, q] == key[b, k]``
    (``[batch, query]`` / ``[batch, key]`` codes; negative codes match nothing), in
    row-major order: keys sorted once, each query's matches found by binary search —
    ``O((query + key) log key + pairs)``, never a ``[query, key]`` comparison."""
    n_batch, n_keys = key.shape
    n_queries = query.shape[1]
    top = int(max(int(query.max()), int(key.max()), 0)) + 1  # codes per batch row
    row = torch.arange(n_batch, device=key.device)[:, None]
    codes = torch.where(key >= 0, key + row * top, -1).flatten()
    wanted = torch.where(query >= 0, query + row * top, -2).flatten()
    # only the keys some query matches are sorted (a long block: few rows, many keys); a
    # key is one when the sorted wanted codes hold it (isin would sort the keys too)
    sought = wanted.sort().values
    at = torch.searchsorted(sought, codes).clamp(max=len(sought) - 1)
    candidates = (sought[at] == codes).nonzero()[:, 0]  # codes -1 match no wanted code
    order = candidates[torch.argsort(codes[candidates], stable=True)]  # key order kept
    ranked = codes[order]
    lo = torch.searchsorted(ranked, wanted)
    count = torch.searchsorted(ranked, wanted, right=True) - lo
    which = torch.repeat_interleave(torch.arange(len(wanted), device=key.device), count)
    within = torch.arange(len(which), device=key.device) - \
        torch.repeat_interleave(count.cumsum(0) - count, count)
    found = order[lo[which] + within]  # flat key index
    return which // n_queries, which % n_queries, found % n_keys


def _rows(means: Means) -> dict[str, np.ndarray] | None:
    """How many rows each copy score is a mean over (0 for a head with none)."""
    found = {f"{name}_rows": means.count(name) for name in COPIES}
    found = {name: np.nan_to_num(rows).astype(int) for name, rows in found.items()
             if rows is not None}
    return found or None


STATS.register("copies")(Copies())
register_means("copies", COPIES, "mass on earlier (`_ahead`: later) copies of the query's "
               "token / on the token after them (Olsson et al.'s induction), over the rows "
               "where one exists; special keys excluded and the rest renormalised", 600)
register_means("rep", tuple("rep_" + c.name for c in Copies.columns), "the same and the "
               "previous token on repeated random tokens `x x` (TransformerLens / Olsson et "
               "al.; bidirectional variants for encoders) built through the tokenizer's own "
               "template: `[CLS] x x [SEP]` for BERT, `<s> x x` for LLaMA, `x x` for GPT-2 "
               "(`attnprobe.heads.probe`)", 610)
SCORES.register("copy_rows")(Score(
    "*_rows", "how many query rows each of duplicate, induction, duplicate_ahead, "
    "induction_ahead is a mean over (rows that hold an earlier / later copy of their token); "
    "the copying labels trust the corpus scores only over enough rows", _rows, 620,
    tuple(f"{name}_rows" for name in COPIES)))
