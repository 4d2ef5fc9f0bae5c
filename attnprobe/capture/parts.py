"""The opt-in parts of a capture: what to do with what a seam hands over.

:func:`attnprobe.capture` is a small core — a model, a :class:`~attnprobe.core.scope.Scope`
and the seam that reaches its attention — plus the parts asked for:

===============  =====================================================  ===================
part             what it does                                           seams
===============  =====================================================  ===================
``Keep``         keep the scoped weights (``cap.maps``, ``cap.batches``) every seam
``Reduce``       feed streaming reducers (``cap.tally``), in row blocks every seam
``Live``         keep the weights in the autograd graph (``cap.live``)  every seam
``Scores``       keep the pre-softmax scores (``AttentionMap.scores``)  modules, hook_points,
                                                                        paths
``Values``       keep the value vectors (``cap.values``)                hf
``Activations``  keep q, k, v and per-head outputs z                    hf, hook_points
                 (``cap.activations``)
``Edit``...      rewrite weights / q / k / v / per-head outputs         :mod:`~attnprobe.
                 (:mod:`attnprobe.capture.rewrites`)                    capture.rewrites`
``Knockout``     block attention edges before the softmax               every seam
===============  =====================================================  ===================

Seams: ``hf`` (transformers' attention interface), ``modules`` (transformers attention modules
that compute their weights themselves; :mod:`attnprobe.capture.module_seam`), ``hook_points``
(attnprobe's reference models), ``paths`` (module paths named by the caller). A part on a seam
that cannot serve it is an :class:`~attnprobe.errors.InputError` before any forward, and so is
a part given twice.

**A new part is one class here**: it says which seams serve it, whether it needs every query
row at once, which tensors of a site it reads or rewrites (:data:`TENSORS`, through
:meth:`Part.on_tensor`), and overrides the hooks it needs (``on_rows``, ``on_tensor``,
``blocked``). Parts see the capture through :class:`Host` (what the recorder offers them),
so this module does not import the recorder. ``Live``, ``Values`` and ``Activations`` hold
every head of each scoped layer (what the forward computed); ``Keep``, ``Reduce`` and
``Scores`` only the scope's heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from attnprobe.capture.calls import ForwardCall
from attnprobe.capture.sites import Site
from attnprobe.core.reducers import Reducer, Tally, default_reducers
from attnprobe.core.row_blocks import TokenView, row_block, visible_from_weights
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError

__all__ = ["SEAMS", "SEAM_NAMES", "TENSORS", "Activations", "Host", "Keep", "Live", "Part",
           "Reduce", "Rows", "Scores", "Values"]

SEAMS = ("hf", "modules", "hook_points", "paths")
SEAM_NAMES = {"hf": "transformers' attention interface (transformers models)",
              "modules": "the model's own attention modules (transformers models such as "
                         "GPT-Neo, Bloom, DeBERTa that compute their weights themselves)",
              "hook_points": "hook points (attnprobe's reference models)",
              "paths": "module paths (paths=[...])"}
# Tensors of a site a part may read or rewrite (Part.on_tensor): queries [batch, head, query,
# d], keys and values [batch, kv_head, key, d] (grouped-query models: the shared heads),
# per-head outputs z [batch, head, query, d] (weights times values, before the output
# projection), the weights [batch, head, query, key] and the pre-softmax scores (same shape).
TENSORS = ("q", "k", "v", "z", "pattern", "scores")


class Host(Protocol):
    """What a capture offers its parts (the recorder; per capture context)."""

    scope: Scope
    tally: Tally
    learned_sinks: set[Site]
    edit_changes: dict[Site, float]

    @property
    def current(self) -> ForwardCall: ...

    def store(self, what: str, site: Site, rows: torch.Tensor) -> None: ...

    def head_index(self, n_heads: int, site: Site) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Rows:
    """One block of query rows of one site as a seam hands it over.

    ``pattern`` ``[batch, head, q_block, k_block]`` (every head), ``kept`` the same
    restricted to ``heads`` (the scope's heads), rows ``q_start .. q_start + q_block`` of
    ``q_total``; ``visible`` ``[batch|1, q_block]``: keys each row may attend to (``None``:
    unknown). Blocks of rows of a long input may hold only the keys their rows may see,
    ``k_start .. k_start + k_block`` of ``k_total`` (the others are masked: no weight).
    """

    site: Site
    pattern: torch.Tensor
    kept: torch.Tensor
    heads: tuple[int, ...]
    q_start: int
    q_total: int
    visible: torch.Tensor | None
    k_start: int = 0
    k_total: int | None = None

    @property
    def keys(self) -> slice:
        """The block's keys among the site's ``k_total``."""
        return slice(self.k_start, self.k_start + self.pattern.shape[3])


class Part:
    """Base of every part: which seams serve it, which other parts it needs (by ``name``),
    which tensors it reads or rewrites, and the hooks it may override."""

    name: ClassVar[str] = "part"
    seams: ClassVar[tuple[str, ...]] = SEAMS
    needs: ClassVar[tuple[str, ...]] = ()  # names of parts it only works next to
    whole_rows: ClassVar[bool] = True  # needs all query rows of a site at once
    tensors: ClassVar[tuple[str, ...]] = ()  # of TENSORS, what on_tensor takes
    rewrites: ClassVar[bool] = False  # on_tensor may return a replacement
    query_block: int | None = None  # rows per block a streaming part asks for (None: any)

    def check_seam(self, seam: str) -> None:
        """Raise InputError unless ``seam`` (one of :data:`SEAMS`) serves this part."""
        if seam not in self.seams:
            served = " or ".join(SEAM_NAMES[s] for s in self.seams)
            raise InputError(f"{self.name} works through {served}; this model is captured "
                             f"through {SEAM_NAMES[seam]}")

    def on_rows(self, host: Host, rows: Rows) -> None:
        """A block of weights arrived (after every edit)."""

    def on_tensor(self, host: Host, site: Site, name: str, tensor: torch.Tensor,
                  n_heads: int) -> torch.Tensor | None:
        """Tensor ``name`` of :data:`TENSORS` at ``site`` (whose layer has ``n_heads`` query
        heads): read it, or return a replacement (parts with ``rewrites``)."""
        return None

    def blocked(self, host: Host, site: Site, shape: torch.Size) -> torch.Tensor | None:
        """Edges the part blocks before the softmax: bool broadcastable to ``shape`` =
        ``[batch, head, query, key]`` (True = blocked), or None."""
        return None


@dataclass(frozen=True)
class Keep(Part):
    """Keep the scoped weights on the CPU as float32 (maps and padded batches)."""

    name: ClassVar[str] = "keep"

    def on_rows(self, host: Host, rows: Rows) -> None:
        kept = rows.kept
        if kept.requires_grad or kept.device.type != "cpu" or kept.dtype != torch.float32:
            kept = kept.detach().to("cpu", torch.float32)
        host.store("patterns", rows.site, kept)


@dataclass(frozen=True)
class Reduce(Part):
    """Feed streaming reducers (default :func:`~attnprobe.core.reducers.default_reducers`);
    with nothing else asking for whole rows, the seam hands over blocks of ``query_block``
    rows (default: as many as fit in 16 MiB)."""

    reducers: Sequence[Reducer] | None = None
    query_block: int | None = None
    name: ClassVar[str] = "reducers"
    whole_rows: ClassVar[bool] = False

    def __post_init__(self) -> None:
        reducers = default_reducers() if self.reducers is None else tuple(self.reducers)
        if not reducers:
            raise InputError("Reduce needs at least one reducer (None: the default ones)")
        object.__setattr__(self, "reducers", tuple(reducers))
        block = self.query_block
        if block is not None and (isinstance(block, bool) or not isinstance(block, int)
                                  or block < 1):
            raise InputError(f"query_block must be a positive integer; got {block!r}")

    def on_rows(self, host: Host, rows: Rows) -> None:
        call = host.current
        site, pattern = rows.site, rows.pattern
        batch, n_heads, q_block, k_block = pattern.shape
        # a tally is per head, so it takes exactly the scope's heads (not the maps' grid)
        heads = host.scope.heads_of(site.layer, n_heads)
        kept = rows.kept if heads == rows.heads else pattern[:, list(heads)]
        kept = kept.detach()
        if kept.element_size() < 4:  # half precision: sum in float32, as the kept maps do
            kept = kept.float()
        queries = TokenView(*call.token_view(site.side, batch, rows.q_total))
        keys = TokenView(*call.token_view(site.key_side, batch, rows.k_total or k_block))
        visible = rows.visible
        if visible is None:  # read from every head's weights (the scope's may all be 0)
            visible = visible_from_weights(pattern, keys.valid[:, rows.keys])
        span = slice(rows.q_start, rows.q_start + q_block)
        block = row_block(kept, queries, keys, rows=span, key_span=rows.keys, visible=visible,
                          learned_sink=site in host.learned_sinks)
        last = rows.q_start + q_block >= rows.q_total  # more blocks of the site follow?
        finite = host.tally.add(site.key, heads, block, self.reducers, more=not last)
        if not finite:  # reducers mask padding rows: a NaN weight a sum reads is a real row's
            raise InputError(f"a real query row at {site.path} has NaN or inf weights "
                             "(fully masked?)")


@dataclass(frozen=True)
class Live(Part):
    """Keep each scoped site's weights ``[batch, head, query, key]`` (every head, padding
    included) as computed, in the autograd graph with gradients retained: after
    ``backward()``, ``cap.live[call][site].grad`` is ∂output/∂attention."""

    name: ClassVar[str] = "live"

    def on_rows(self, host: Host, rows: Rows) -> None:
        if rows.pattern.requires_grad:
            rows.pattern.retain_grad()
        host.current.live[rows.site] = rows.pattern


@dataclass(frozen=True)
class Values(Part):
    """Keep each scoped site's value vectors ``[batch, head, key, d_head]`` (every head;
    key/value heads repeated for grouped-query attention), e.g. for the norm-based view
    ``‖α f(x)‖``."""

    name: ClassVar[str] = "values"
    seams: ClassVar[tuple[str, ...]] = ("hf",)
    tensors: ClassVar[tuple[str, ...]] = ("v",)

    def on_tensor(self, host: Host, site: Site, name: str, tensor: torch.Tensor,
                  n_heads: int) -> None:
        groups = n_heads // tensor.shape[1]
        value = tensor.detach()
        host.current.values[site] = value.repeat_interleave(groups, 1) if groups > 1 \
            else value


@dataclass(frozen=True)
class Scores(Part):
    """Keep the pre-softmax scores next to the kept weights (so it needs :class:`Keep`);
    needs ``hook_scores`` modules next to the patterns, as attnprobe's reference models
    have."""

    name: ClassVar[str] = "scores"
    needs: ClassVar[tuple[str, ...]] = ("keep",)
    seams: ClassVar[tuple[str, ...]] = ("modules", "hook_points", "paths")
    tensors: ClassVar[tuple[str, ...]] = ("scores",)

    def on_tensor(self, host: Host, site: Site, name: str, tensor: torch.Tensor,
                  n_heads: int) -> None:
        heads = host.head_index(tensor.shape[1], site)
        kept = tensor[:, list(heads)].detach().to("cpu", torch.float32)
        host.store("scores", site, kept)


@dataclass(frozen=True)
class Activations(Part):
    """Keep each scoped site's queries, keys, values and per-head outputs (``names``, of
    ``q k v z``) as computed: ``cap.activations[call][site][name]``, every head,
    ``[batch, head|kv_head, position, d_head]`` (detached; ``grad=True`` keeps them in the
    autograd graph with gradients retained, e.g. for attribution patching). Queries and keys
    are those the scores are computed from (after rotary embeddings)."""

    names: tuple[str, ...] = ("q", "k", "v", "z")
    grad: bool = False
    name: ClassVar[str] = "activations"
    seams: ClassVar[tuple[str, ...]] = ("hf", "hook_points", "paths")

    def __post_init__(self) -> None:
        bad = [n for n in self.names if n not in ("q", "k", "v", "z")]
        if bad or not self.names:
            raise InputError(f"Activations keeps q, k, v and z; got {list(self.names)}")

    @property
    def tensors(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.names)

    def on_tensor(self, host: Host, site: Site, name: str, tensor: torch.Tensor,
                  n_heads: int) -> None:
        if self.grad and tensor.requires_grad:
            tensor.retain_grad()
        kept = tensor if self.grad else tensor.detach()
        host.current.activations.setdefault(site, {})[name] = kept
