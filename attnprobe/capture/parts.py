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
``Scores``     keep the pre-softmax scores (``AttentionMap.scores``)    hook_points, paths
=============  =======================================================  ====================

Seams: ``hf`` (transformers' attention interface), ``hook_points`` (attnprobe's reference
models), ``paths`` (module paths named by the caller). A part on a seam that cannot serve it is
an :class:`~attnprobe.errors.InputError` before any forward. A new part is one class here: it
says which seams serve it, whether it needs every query row at once, and overrides the hooks
it needs (``on_rows``, ``edit_weights``, ``edit_outputs``, ``on_values``, ``on_scores``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from attnprobe.capture.sites import Site
from attnprobe.core.reducers import Reducer, RowBlock
from attnprobe.errors import InputError

if TYPE_CHECKING:
    from attnprobe.capture.recorder import Recorder

__all__ = ["SEAMS", "Edit", "EditFn", "EditOutput", "Keep", "Live", "Part", "Reduce", "Rows",
           "Scores", "Values"]

SEAMS = ("hf", "hook_points", "paths")
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
    """Base of every part: which seams serve it and the hooks it may override."""

    name: ClassVar[str] = "part"
    seams: ClassVar[tuple[str, ...]] = SEAMS
    whole_rows: ClassVar[bool] = True  # needs all query rows of a site at once

    def check_seam(self, seam: str) -> None:
        if seam not in self.seams:
            raise InputError(f"{self.name} works through the {' or '.join(self.seams)} seam; "
                             f"this model is captured through {seam}")

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
        kept = rows.kept.detach().to("cpu", torch.float32)
        recorder.store("patterns", rows.site, kept)


@dataclass(frozen=True)
class Reduce(Part):
    """Feed streaming reducers; with nothing else asking for whole rows, the seam hands over
    blocks of ``query_block`` rows (default: as many as fit in 16 MiB)."""

    reducers: Sequence[Reducer] = ()
    query_block: int | None = None
    name: ClassVar[str] = "reducers"
    whole_rows: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "reducers", tuple(self.reducers))
        block = self.query_block
        if block is not None and (isinstance(block, bool) or not isinstance(block, int)
                                  or block < 1):
            raise InputError(f"query_block must be a positive integer; got {block!r}")

    def on_rows(self, recorder: Recorder, rows: Rows) -> None:
        if not self.reducers:
            return
        call = recorder.current
        site, pattern = rows.site, rows.pattern
        batch, _, q_block, k_len = pattern.shape
        q_valid, q_pos, q_ids = call.token_view(site.side, batch, rows.q_total)
        k_valid, k_pos, k_ids = call.token_view(site.key_side, batch, k_len)
        span = slice(rows.q_start, rows.q_start + q_block)
        real_rows = q_valid[:, None, span].to(rows.kept.device)
        if not torch.isfinite(rows.kept.sum(-1)).logical_or(~real_rows).all():
            raise InputError(f"a real query row at {site.path} has NaN or inf weights "
                             "(fully masked?)")
        visible = rows.visible
        if visible is None:  # keys any head gave weight to; exact unless every head underflows
            seen = (pattern.detach() > 0).any(1) & k_valid[:, None, :].to(pattern.device)
            visible = seen.sum(-1)
        block = RowBlock(pattern=rows.kept.detach(), query_valid=q_valid[:, span],
                         query_pos=q_pos[:, span], key_pos=k_pos,
                         key_len=k_valid.sum(-1).clamp(min=1),
                         visible=visible.expand(batch, q_block).cpu(),
                         query_ids=None if q_ids is None else q_ids[:, span], key_ids=k_ids)
        recorder.tally.add(site.key, rows.heads, block, self.reducers)


def _checked(recorder: Recorder, site: Site, before: torch.Tensor, edited: object,
             what: str) -> torch.Tensor:
    """The edit's result, checked: same shape, finite in the model's dtype; notes the change."""
    if not isinstance(edited, torch.Tensor) or edited.shape != before.shape:
        got = tuple(edited.shape) if isinstance(edited, torch.Tensor) else type(edited).__name__
        raise InputError(f"{what} at {site.path} must return a tensor of shape "
                         f"{tuple(before.shape)}; got {got}")
    if not torch.isfinite(edited).all():
        raise InputError(f"{what} at {site.path} returned NaN or inf")
    cast = edited.to(before.dtype)
    if not torch.isfinite(cast).all():
        raise InputError(f"{what} at {site.path} returned values that overflow the model's "
                         f"{str(before.dtype).removeprefix('torch.')} (largest "
                         f"{edited.abs().max().item():.3g})")
    change = (cast - before).abs().max().item() if before.numel() else 0.0
    recorder.edit_changes[site] = max(recorder.edit_changes.get(site, 0.0), change)
    return cast


@dataclass(frozen=True)
class Edit(Part):
    """``fn(layer, pattern) -> pattern`` on the scoped layers' weights ``[batch, head, query,
    key]`` between the softmax and the values. ``fn`` gets a copy, so editing it in place
    and returning it works; the capture checks that some weight changed."""

    fn: EditFn = field(repr=False, default=None)  # type: ignore[assignment]
    name: ClassVar[str] = "edit"

    def edit_weights(self, recorder: Recorder, site: Site, pattern: torch.Tensor
                     ) -> torch.Tensor:
        edited = self.fn(site.layer, pattern.clone())
        return _checked(recorder, site, pattern, edited, "edit")


@dataclass(frozen=True)
class EditOutput(Part):
    """``fn(layer, output) -> output`` on the per-head outputs ``[batch, head, query, d_head]``
    (weights times values, before the output projection), e.g. mean-ablation."""

    fn: EditFn = field(repr=False, default=None)  # type: ignore[assignment]
    name: ClassVar[str] = "edit_output"
    seams: ClassVar[tuple[str, ...]] = ("hf",)

    def edit_outputs(self, recorder: Recorder, site: Site, output: torch.Tensor
                     ) -> torch.Tensor:
        edited = self.fn(site.layer, output.clone())
        return _checked(recorder, site, output, edited, "edit_output")


@dataclass(frozen=True)
class Live(Part):
    """Keep each site's weights as computed, in the autograd graph with gradients retained:
    after ``backward()``, ``cap.live[call][site].grad`` is ∂output/∂attention."""

    name: ClassVar[str] = "live"

    def on_rows(self, recorder: Recorder, rows: Rows) -> None:
        if rows.pattern.requires_grad:
            rows.pattern.retain_grad()
        recorder.current.live[rows.site] = rows.pattern


@dataclass(frozen=True)
class Values(Part):
    """Keep each site's value vectors ``[batch, head, key, d_head]`` (key/value heads repeated
    for grouped-query attention), e.g. for the norm-based view ``‖α f(x)‖``."""

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
    """Keep the pre-softmax scores next to the kept weights; needs ``hook_scores`` modules
    next to the patterns, as attnprobe's reference models have."""

    name: ClassVar[str] = "scores"
    seams: ClassVar[tuple[str, ...]] = ("hook_points", "paths")

    def on_scores(self, recorder: Recorder, site: Site, scores: torch.Tensor) -> None:
        heads = recorder.head_index(scores.shape[1], site)
        kept = scores[:, list(heads)].detach().to("cpu", torch.float32)
        recorder.store("scores", site, kept)
