"""The opt-in parts of a capture: what to do with the weights a seam hands over.

:func:`attnprobe.capture` is a small core — a model, a :class:`~attnprobe.core.scope.Scope`
and the seam that reaches its attention — plus the parts asked for:

=============  =======================================================  ====================
part           what it does                                             seams
=============  =======================================================  ====================
``Keep``       keep the scoped weights (``cap.maps``, ``cap.batches()``) every seam
``Reduce``     feed streaming reducers (``cap.tally``), in row blocks   every seam
``Edit``       change the weights between the softmax and the values    every seam
``EditOutput`` change per-head outputs before the output projection     hf
``Live``       keep the weights in the autograd graph (``cap.live``)    every seam
``Values``     keep the value vectors (``cap.values``)                  hf
``Scores``     keep the pre-softmax scores (``AttentionMap.scores``)    modules, hook_points,
                                                                        paths
=============  =======================================================  ====================

Seams: ``hf`` (transformers' attention interface), ``modules`` (transformers attention modules
that compute their weights themselves; :mod:`attnprobe.capture.module_seam`), ``hook_points``
(attnprobe's reference models), ``paths`` (module paths named by the caller). A part on a seam
that cannot serve it is an :class:`~attnprobe.errors.InputError` before any forward, and so is
a part given twice. A new
part is one class here: it says which seams serve it, whether it needs every query row at once,
and overrides the hooks it needs (``on_rows``, ``on_values``, ``on_scores``). ``Live`` and
``Values`` hold every head of each scoped layer (what the forward computed); ``Keep``,
``Reduce`` and ``Scores`` only the scope's heads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from attnprobe.capture.sites import Site
from attnprobe.core.reducers import Reducer, RowBlock, default_reducers
from attnprobe.errors import InputError

if TYPE_CHECKING:
    from attnprobe.capture.recorder import Recorder

__all__ = ["SEAMS", "SEAM_NAMES", "Edit", "EditFn", "EditOutput", "Keep", "Live", "Part",
           "Reduce", "Rows", "Scores", "Values"]

SEAMS = ("hf", "modules", "hook_points", "paths")
SEAM_NAMES = {"hf": "transformers' attention interface (transformers models)",
              "modules": "the model's own attention modules (transformers models such as "
                         "GPT-Neo, Bloom, DeBERTa that compute their weights themselves)",
              "hook_points": "hook points (attnprobe's reference models)",
              "paths": "module paths (paths=[...])"}
EditFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Rows:
    """One block of query rows of one site as a seam hands it over.

    ``pattern`` ``[batch, head, q_block, key]`` (every head), ``kept`` the same restricted to
    ``heads`` (the scope's heads), rows ``q_start .. q_start + q_block`` of ``q_total``;
    ``visible`` ``[batch|1, q_block]``: keys each row may attend to (``None``: unknown).
    """

    site: Site
    pattern: torch.Tensor
    kept: torch.Tensor
    heads: tuple[int, ...]
    q_start: int
    q_total: int
    visible: torch.Tensor | None


class Part:
    """Base of every part: which seams serve it, which other parts it needs (by ``name``),
    and the hooks it may override."""

    name: ClassVar[str] = "part"
    seams: ClassVar[tuple[str, ...]] = SEAMS
    needs: ClassVar[tuple[str, ...]] = ()  # names of parts it only works next to
    whole_rows: ClassVar[bool] = True  # needs all query rows of a site at once

    def check_seam(self, seam: str) -> None:
        """Raise InputError unless ``seam`` (one of :data:`SEAMS`) serves this part."""
        if seam not in self.seams:
            served = " or ".join(SEAM_NAMES[s] for s in self.seams)
            raise InputError(f"{self.name} works through {served}; this model is captured "
                             f"through {SEAM_NAMES[seam]}")

    def on_rows(self, recorder: Recorder, rows: Rows) -> None:
        """A block of weights arrived (after every edit)."""

    def on_values(self, recorder: Recorder, site: Site, value: torch.Tensor,
                  n_heads: int) -> None:
        """Value vectors ``[batch, kv_head, key, d]`` of a site (hf seam)."""

    def on_scores(self, recorder: Recorder, site: Site, scores: torch.Tensor) -> None:
        """Pre-softmax scores ``[batch, head, query, key]`` (hook seams)."""


@dataclass(frozen=True)
class Keep(Part):
    """Keep the scoped weights on the CPU as float32 (maps and padded batches)."""

    name: ClassVar[str] = "keep"

    def on_rows(self, recorder: Recorder, rows: Rows) -> None:
        kept = rows.kept
        if kept.requires_grad or kept.device.type != "cpu" or kept.dtype != torch.float32:
            kept = kept.detach().to("cpu", torch.float32)
        recorder.store("patterns", rows.site, kept)


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

    def on_rows(self, recorder: Recorder, rows: Rows) -> None:
        call = recorder.current
        site, pattern = rows.site, rows.pattern
        batch, n_heads, q_block, k_len = pattern.shape
        # a tally is per head, so it takes exactly the scope's heads (not the maps' grid)
        heads = recorder.scope.heads_of(site.layer, n_heads)
        kept = rows.kept if heads == rows.heads else pattern[:, list(heads)]
        kept = kept.detach()
        if kept.element_size() < 4:  # half precision: sum in float32, as the kept maps do
            kept = kept.float()
        q_valid, q_pos, q_ids = call.token_view(site.side, batch, rows.q_total)
        k_valid, k_pos, k_ids = call.token_view(site.key_side, batch, k_len)
        span = slice(rows.q_start, rows.q_start + q_block)
        real_rows = q_valid[:, None, span].to(kept.device)
        if not torch.isfinite(kept.sum(-1)).logical_or(~real_rows).all():
            raise InputError(f"a real query row at {site.path} has NaN or inf weights "
                             "(fully masked?)")
        visible = rows.visible
        if visible is None:  # keys any head gave weight to; exact unless every head underflows
            seen = (pattern.detach() > 0).any(1) & k_valid[:, None, :].to(pattern.device)
            visible = seen.sum(-1)
        block = RowBlock(pattern=kept, query_valid=q_valid[:, span],
                         query_pos=q_pos[:, span], key_pos=k_pos,
                         key_len=k_valid.sum(-1).clamp(min=1),
                         visible=visible.expand(batch, q_block).cpu(),
                         query_ids=None if q_ids is None else q_ids[:, span], key_ids=k_ids,
                         learned_sink=site in recorder.learned_sinks)
        recorder.tally.add(site.key, heads, block, self.reducers)


def _checked(recorder: Recorder, site: Site, before: torch.Tensor, edited: object,
             what: str) -> torch.Tensor:
    """The edit's result ``[batch, head, ...]``, checked: same shape, finite in the model's
    dtype; heads outside the scope keep ``before`` (the tensor as it was before the edit
    ran), against which the change is noted."""
    if not isinstance(edited, torch.Tensor) or edited.shape != before.shape:
        got = tuple(edited.shape) if isinstance(edited, torch.Tensor) else type(edited).__name__
        raise InputError(f"{what} at {site.path} must return a tensor of shape "
                         f"{tuple(before.shape)}; got {got}")
    dtype = str(before.dtype).removeprefix("torch.")
    if not torch.isfinite(edited).all():
        raise InputError(f"{what} at {site.path} returned NaN or inf (the model computes in "
                         f"{dtype}, largest value {torch.finfo(before.dtype).max:.3g})")
    cast = edited.to(device=before.device, dtype=before.dtype)
    if not torch.isfinite(cast).all():  # e.g. float32 results beyond float16's 65504
        raise InputError(f"{what} at {site.path} returned values that overflow the model's "
                         f"{dtype} (largest {edited.abs().max().item():.3g}, {dtype} holds "
                         f"{torch.finfo(before.dtype).max:.3g})")
    heads = recorder.scope.heads_of(site.layer, before.shape[1])
    if len(heads) < before.shape[1]:  # the scope says which heads an edit may touch
        inside = torch.zeros(before.shape[1], dtype=torch.bool, device=before.device)
        inside[list(heads)] = True
        cast = torch.where(inside[:, None, None], cast, before)
    change = (cast - before).abs().max().item() if before.numel() else 0.0
    recorder.edit_changes[site] = max(recorder.edit_changes.get(site, 0.0), change)
    return cast


@dataclass(frozen=True)
class _Rewrite(Part):
    """A part that replaces a tensor of the forward with ``fn(layer, tensor)``."""

    fn: EditFn = field(repr=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InputError(f"{self.name} needs a function fn(layer, tensor) -> tensor; got "
                             f"{type(self.fn).__name__}")

    def apply(self, recorder: Recorder, site: Site, tensor: torch.Tensor) -> torch.Tensor:
        """``fn(layer, copy of tensor)``, checked (:func:`_checked`). ``fn`` gets a copy, so an
        in-place edit that returns its argument works and is measured against the original."""
        return _checked(recorder, site, tensor, self.fn(site.layer, tensor.clone()), self.name)


@dataclass(frozen=True)
class Edit(_Rewrite):
    """``fn(layer, pattern) -> pattern`` on the scoped layers' weights ``[batch, head, query,
    key]`` between the softmax and the values. ``fn`` sees every head of the layer; what it
    returns for heads outside the scope is dropped. The capture checks that some weight
    changed."""

    name: ClassVar[str] = "edit"


@dataclass(frozen=True)
class EditOutput(_Rewrite):
    """``fn(layer, output) -> output`` on the per-head outputs ``[batch, head, query, d_head]``
    (weights times values, before the output projection), e.g. mean-ablation; like
    :class:`Edit`, only the scope's heads take the result."""

    name: ClassVar[str] = "edit_output"
    seams: ClassVar[tuple[str, ...]] = ("hf",)


@dataclass(frozen=True)
class Live(Part):
    """Keep each scoped site's weights ``[batch, head, query, key]`` (every head, padding
    included) as computed, in the autograd graph with gradients retained: after
    ``backward()``, ``cap.live[call][site].grad`` is ∂output/∂attention."""

    name: ClassVar[str] = "live"

    def on_rows(self, recorder: Recorder, rows: Rows) -> None:
        if rows.pattern.requires_grad:
            rows.pattern.retain_grad()
        recorder.current.live[rows.site] = rows.pattern


@dataclass(frozen=True)
class Values(Part):
    """Keep each scoped site's value vectors ``[batch, head, key, d_head]`` (every head;
    key/value heads repeated for grouped-query attention), e.g. for the norm-based view
    ``‖α f(x)‖``."""

    name: ClassVar[str] = "values"
    seams: ClassVar[tuple[str, ...]] = ("hf",)

    def on_values(self, recorder: Recorder, site: Site, value: torch.Tensor,
                  n_heads: int) -> None:
        groups = n_heads // value.shape[1]
        value = value.detach()
        recorder.current.values[site] = value.repeat_interleave(groups, 1) if groups > 1 \
            else value


@dataclass(frozen=True)
class Scores(Part):
    """Keep the pre-softmax scores next to the kept weights (so it needs :class:`Keep`);
    needs ``hook_scores`` modules next to the patterns, as attnprobe's reference models
    have."""

    name: ClassVar[str] = "scores"
    needs: ClassVar[tuple[str, ...]] = ("keep",)
    seams: ClassVar[tuple[str, ...]] = ("modules", "hook_points", "paths")

    def on_scores(self, recorder: Recorder, site: Site, scores: torch.Tensor) -> None:
        heads = recorder.head_index(scores.shape[1], site)
        kept = scores[:, list(heads)].detach().to("cpu", torch.float32)
        recorder.store("scores", site, kept)
