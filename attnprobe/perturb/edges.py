"""Which attention edges a knockout blocks: the edges language and the masks of a batch.

An edge is "query ``i`` may read key ``j``"; a knockout blocks edges before the softmax
(:class:`~attnprobe.capture.Knockout`: each row renormalises over the keys it keeps, keys the
model masks stay masked; Geva et al. 2023). Positions count the example's **real** tokens
from 0 (padding, left or right, is skipped); a negative position counts from the end
(``-1`` is the last real token).

=====================  ==================================================================
edges                  blocks, in every scoped layer and head
=====================  ==================================================================
``to:POSITIONS``       every query's edges to those keys (a token still reads itself)
``from:POSITIONS``     those queries' edges to every other key (each reads only itself)
``last-to:POSITIONS``  the last real token's edges to those keys: Geva et al.'s
                       "last-to-subject" knockout when ``POSITIONS`` are the subject's
                       tokens (the last token may not read the subject)
``edge:Q>K[,Q>K...]``  exactly those edges (a token's edge to itself included)
callable               ``(example, layer, head) -> bool [query, key]`` over the example's
                       real tokens (True = blocked; broadcastable, e.g. ``[1, key]``), or
                       ``None`` for nothing in that head; ``example`` is the text's index in
                       the caller's list
=====================  ==================================================================

``POSITIONS``: comma-separated positions, ranges ``A-B`` (inclusive) and ``last``, e.g.
``0``, ``1-3,last``, ``-2``. The named kinds never block a token's edge to itself, so every
row keeps a key (``to:0`` on a causal model blocks every later token's edge to the first
token, not the first token's own row); ``edge:`` does exactly what it lists, and an edge list
that leaves a row no key is the capture's one-line error.

**Blocks nothing is an error**, per example: an example none of whose scoped rows loses an
edge it could see (on a causal model, keys after the query are already masked) raises
:class:`~attnprobe.errors.EditNotAppliedError` naming it, as does a knockout the capture finds
blocked nothing at all. New kinds are entries of :data:`EDGE_KINDS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnprobe.capture import Knockout
from attnprobe.core.registry import Registry, one_of
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError

__all__ = ["EDGE_KINDS", "EdgeFn", "EdgeMasks", "Edges", "parse_edges"]

EdgeFn = Callable[[int, int, int], Any]  # (example, layer, head) -> bool [query, key] | None
Named = Callable[[int], torch.Tensor]  # n real tokens -> bool [n, n]

_ITEM = re.compile(r"^(?:(-?\d+)|(\d+)-(\d+)|(last))$")


# ----------------------------------------------------------------------------- positions
def _items(text: str, spec: str) -> list[str]:
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(items):
        raise InputError(f"edges {spec!r} needs positions, e.g. '0', '1-3,last' or '-1'")
    for item in items:
        if not _ITEM.match(item):
            raise InputError(f"edges {spec!r}: {item!r} is not a position (an integer, a range "
                             "A-B or 'last')")
    return items


def _resolve(items: Sequence[str], n: int, spec: str) -> list[int]:
    """The positions ``items`` name in a text of ``n`` real tokens."""
    found = []
    for item in items:
        single, low, high, last = _ITEM.match(item).groups()  # type: ignore[union-attr]
        if last:
            found.append(n - 1)
            continue
        if single is not None:
            p = int(single)
            q = p + n if p < 0 else p
            if not 0 <= q < n:
                raise InputError(f"edges {spec!r}: position {p} is out of range for a text of "
                                 f"{n} tokens")
            found.append(q)
            continue
        a, b = int(low), int(high)
        if a > b:
            raise InputError(f"edges {spec!r}: range {item} is empty (write it low-high)")
        if b >= n:
            raise InputError(f"edges {spec!r}: range {item} is out of range for a text of {n} "
                             "tokens")
        found += range(a, b + 1)
    return found


# ----------------------------------------------------------------------------- kinds
EDGE_KINDS: Registry[Callable[[str, str], Named]] = Registry("edges kind")


def _marked_edges(argument: str, spec: str,
                  edges: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> Named:
    """A kind that names ``POSITIONS``: ``edges(marked)`` turns the named positions (bool
    ``[n]``) into the blocked queries and keys (bool ``[n]`` each: every pair of one of each
    is blocked), never a token's edge to itself."""
    items = _items(argument, spec)

    def named(n: int) -> torch.Tensor:
        marked = torch.zeros(n, dtype=torch.bool)
        marked[_resolve(items, n, spec)] = True
        queries, keys = edges(marked)
        return queries[:, None] & keys[None, :] & ~torch.eye(n, dtype=torch.bool)

    return named


def _last(marked: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: only the last position."""
    last = torch.zeros_like(marked)
    last[-1] = True
    return last


@EDGE_KINDS.register("to")
def _to(argument: str, spec: str) -> Named:
    return _marked_edges(argument, spec, lambda keys: (torch.ones_like(keys), keys))


@EDGE_KINDS.register("from")
def _from(argument: str, spec: str) -> Named:
    return _marked_edges(argument, spec, lambda queries: (queries, torch.ones_like(queries)))


@EDGE_KINDS.register("last-to")
def _last_to(argument: str, spec: str) -> Named:
    return _marked_edges(argument, spec, lambda keys: (_last(keys), keys))


@EDGE_KINDS.register("edge")
def _edge(argument: str, spec: str) -> Named:
    pairs = [part.strip() for part in argument.split(",")]
    if not argument.strip() or not all(">" in p for p in pairs):
        raise InputError(f"edges {spec!r} needs query>key pairs, e.g. 'edge:5>2,5>3'")
    sides = [[side.strip() for side in p.split(">", 1)] for p in pairs]
    for query, key in sides:
        _items(query, spec), _items(key, spec)  # one position each side, checked now

    def named(n: int) -> torch.Tensor:
        blocked = torch.zeros(n, n, dtype=torch.bool)
        for query, key in sides:
            blocked[_resolve([query], n, spec), _resolve([key], n, spec)] = True
        return blocked

    return named


@dataclass(frozen=True)
class Edges:
    """Parsed edges: a named kind (``named(n) -> bool [n, n]``, the same in every layer and
    head) or a callable ``fn(example, layer, head)``. ``spec`` is what the table records
    (``custom`` for a callable)."""

    spec: str
    named: Named | None = field(default=None, repr=False)
    fn: EdgeFn | None = field(default=None, repr=False)

    def matrix(self, example: int, layer: int, head: int, n: int) -> torch.Tensor | None:
        """``[n, n]`` bool over the example's ``n`` real tokens (None: nothing blocked)."""
        if self.named is not None:
            return self.named(n)
        found = self.fn(example, layer, head)  # type: ignore[misc]
        if found is None:
            return None
        if not isinstance(found, torch.Tensor) or found.dtype != torch.bool:
            got = getattr(found, "dtype", type(found).__name__)
            raise InputError(f"the edges callable must return a bool tensor [query, key] (True "
                             f"= blocked) or None; got {got} for example {example}, layer "
                             f"{layer}, head {head}")
        try:
            return torch.broadcast_to(found.cpu(), (n, n))
        except RuntimeError:
            raise InputError(f"the edges callable returned shape {tuple(found.shape)} for "
                             f"example {example} (layer {layer}, head {head}), which has {n} "
                             f"real tokens: expected [{n}, {n}]") from None


def parse_edges(edges: Any) -> Edges:
    """The :class:`Edges` a spec string or a callable names (module docstring).

    Example:
        >>> edges = parse_edges("last-to:1-3")
        >>> edges.matrix(0, 0, 0, 5)  # bool [5, 5]: row 4 (the last token) loses keys 1-3
    """
    if isinstance(edges, Edges):
        return edges
    if callable(edges) and not isinstance(edges, str):
        return Edges("custom", fn=edges)
    if not isinstance(edges, str):
        raise InputError(f"edges must be a spec such as 'to:0' or 'last-to:1-3', or a callable "
                         f"(example, layer, head) -> bool [query, key]; got "
                         f"{type(edges).__name__}")
    kind, colon, argument = edges.strip().partition(":")
    if not colon or kind.strip() not in EDGE_KINDS:
        raise InputError(one_of("edges kind", kind.strip(), EDGE_KINDS.names())
                         + f" in {edges!r} (e.g. 'to:0', 'from:-1', 'last-to:1-3', "
                           "'edge:5>2')")
    spec = f"{kind.strip()}:{argument.strip()}"
    return Edges(spec, named=EDGE_KINDS.get(kind.strip())(argument.strip(), spec))


# ----------------------------------------------------------------------------- batches
@dataclass(frozen=True)
class RowUnit:
    """What one batch row knocks out: ``heads`` of ``layer`` (a sweep unit)."""

    layer: int
    heads: tuple[int, ...]


class EdgeMasks:
    """The knockout of one padded batch: ``fn(layer, shape) -> bool [batch, head, query,
    key]`` for :class:`~attnprobe.capture.Knockout` (:attr:`part`).

    Args:
        edges: what is blocked (:func:`parse_edges`).
        batch: ``attention_mask`` ``[batch, seq]`` (1 = real token; left or right padding)
            or the whole model input.
        examples: the caller's index of each row's text (what a callable receives; default
            ``0..batch-1``).
        scope: the heads knocked out in each layer (the capture's scope).
        units: per row, the one layer and heads that row knocks out (sweeps), else the scope.
        causal: whether the model masks keys after the query (what a row "could see", for
            the blocks-nothing check).

    After the forward, :meth:`idle` lists the rows that lost no edge they could see.
    """

    def __init__(self, edges: Edges, batch: Mapping[str, torch.Tensor] | torch.Tensor, *,
                 examples: Sequence[int] | None = None, scope: Scope | None = None,
                 units: Sequence[RowUnit] | None = None, causal: bool = False) -> None:
        real = batch if isinstance(batch, torch.Tensor) else batch.get("attention_mask")
        if real is None:
            ids = batch["input_ids"]  # type: ignore[index]
            real = torch.ones_like(ids, dtype=torch.bool)
        self.real = real.bool()
        n_rows = self.real.shape[0]
        self.edges = edges
        self.examples = list(range(n_rows)) if examples is None else list(examples)
        self.scope = scope or Scope()
        self.units = None if units is None else list(units)
        if len(self.examples) != n_rows or (self.units is not None
                                            and len(self.units) != n_rows):
            raise InputError(f"edge masks: {n_rows} batch rows but {len(self.examples)} "
                             "examples" + ("" if self.units is None
                                           else f" and {len(self.units)} units"))
        self.causal = causal
        self.hit = [False] * n_rows
        self._slots = [row.nonzero().flatten() for row in self.real]
        self._named: dict[int, torch.Tensor] = {}
        self._shared: torch.Tensor | None = None  # named edges, no units: [batch, 1, seq, seq]

    @property
    def part(self) -> Knockout:
        return Knockout(self)

    def idle(self) -> list[int]:
        """Rows (batch indices) that lost no edge they could see."""
        return [r for r, hit in enumerate(self.hit) if not hit]

    def _matrix(self, r: int, layer: int, head: int) -> torch.Tensor | None:
        n = len(self._slots[r])
        if self.edges.named is None:
            return self.edges.matrix(self.examples[r], layer, head, n)
        if r not in self._named:  # the same for every layer and head
            try:
                self._named[r] = self.edges.named(n)
            except InputError as exc:
                raise InputError(f"example {self.examples[r]}: {exc}") from None
        return self._named[r]

    def _check_rows(self, matrix: torch.Tensor, visible: torch.Tensor, r: int, layer: int,
                    head: int | None) -> None:
        """Every real row keeps a key it can see. Checked here as well as by the capture: a
        reference model applies its causal mask after ``hook_scores``, where the seam cannot
        see it, and a row left without a key would be NaN."""
        empty = ~(visible & ~matrix).any(-1)
        if bool(empty.any()):
            q = int(empty.nonzero()[0])
            where = f"layer {layer}" + ("" if head is None else f", head {head}")
            raise InputError(f"knockout {self.edges.spec!r} blocks every key query {q} of "
                             f"example {self.examples[r]} may read ({where}); a row needs a "
                             "key left")

    def _heads(self, r: int, layer: int, n_heads: int) -> tuple[int, ...]:
        if self.units is None:
            return self.scope.heads_of(layer, n_heads)
        unit = self.units[r]
        return unit.heads if unit.layer == layer else ()

    def __call__(self, layer: int, shape: torch.Size) -> torch.Tensor:
        n_rows, seq = self.real.shape
        if shape[0] != n_rows or shape[2] != seq or shape[3] != seq:
            raise InputError(f"knockout edges are resolved on the batch's tokens [{n_rows}, "
                             f"{seq}]; layer {layer}'s attention is {list(shape)} [batch, head, "
                             "query, key] (a knockout by position needs self-attention over "
                             "the input tokens)")
        shared = self.edges.named is not None and self.units is None
        if shared and self._shared is not None:  # the same in every layer and head
            return self._shared
        size = (n_rows, 1, seq, seq) if shared else tuple(shape)
        blocked = torch.zeros(size, dtype=torch.bool, device=self.real.device)
        for r in range(n_rows):
            slots = self._slots[r].to(blocked.device)
            n = len(slots)
            visible = torch.ones(n, n, dtype=torch.bool)
            if self.causal:
                visible = visible.tril()
            for h in (0,) if shared else self._heads(r, layer, shape[1]):
                matrix = self._matrix(r, layer, h)
                if matrix is None:
                    continue
                self._check_rows(matrix, visible, r, layer, None if shared else h)
                self.hit[r] = self.hit[r] or bool((matrix & visible).any())
                blocked[r, h, slots[:, None], slots[None, :]] = matrix.to(blocked.device)
        if shared:
            self._shared = blocked
        return blocked
