"""The seam for attention modules that compute their weights themselves.

GPT-Neo, Bloom, Falcon, MPT, DeBERTa, MPNet, XLNet, ... do not route attention through
transformers' attention interface: the softmax is a line of their own ``forward``. While such
a module runs, the capture reads (and may replace) what that line computes: a
:class:`~torch.overrides.TorchFunctionMode` is pushed for the module's forward only, in the
calling thread only, and hands over

- every **softmax over the last axis** whose result is ``[batch, head, query, key]`` (or
  ``[batch·head, query, key]``, or a family layout from
  :data:`~attnprobe.capture.layouts.LAYOUTS`): the weights exactly
  as the model computed them, at its precision. An edit returns the edited weights in their
  place, so they flow into the module's own dropout and value product;
- every call of **torch's scaled_dot_product_attention** (a module's SDPA path): computed
  here as ``softmax(q kᵀ · scale + mask) · v`` with SDPA's arguments (masks, ``is_causal``,
  ``scale``, grouped heads), so the weights exist and an edit reaches the output.

Which parts this seam serves: :class:`~attnprobe.capture.parts.Keep`, ``Reduce``, ``Edit``,
``Live`` and ``Scores`` (the softmax's input; for SDPA the masked scores); not ``EditOutput``
or ``Values`` (the per-head outputs and values are the module's own business). A module whose
run computed no such softmax is named at the end of the capture, never skipped silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from attnprobe.capture.layouts import LAYOUTS, ROWS_LAST, Layout
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.runs import Run
from attnprobe.capture.sites import Site
from attnprobe.errors import AttentionUnavailableError, InputError

__all__ = ["module_seam", "sdpa_scores"]

_SOFTMAXES = frozenset({torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax,
                        torch.special.softmax})
_SDPA = torch.nn.functional.scaled_dot_product_attention


def _softmax_dim(args: tuple, kwargs: dict) -> int | None:
    tensor = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if not isinstance(dim, int) or not isinstance(tensor, torch.Tensor):
        return None
    return dim % tensor.ndim if tensor.ndim else None


def _sdpa_arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    given = dict(zip(names, args, strict=False))
    given.update(kwargs)
    return given


def sdpa_scores(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> torch.Tensor:
    """The masked scores ``[batch, head, query, key]`` whose softmax torch's
    ``scaled_dot_product_attention`` takes for these arguments (a closed key is the dtype's
    lowest value rather than -inf, so a fully masked padding row stays finite)."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if key.shape[-3] != query.shape[-3]:  # grouped heads (enable_gqa, or a caller's repeat)
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    low = torch.finfo(scores.dtype).min
    q_len, k_len = scores.shape[-2], scores.shape[-1]
    if is_causal:
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~allowed, low)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, low)
        else:
            scores = (scores + attn_mask.to(scores.dtype)).clamp(min=low)
    return scores


class _Reader(TorchFunctionMode):
    """Active during one module run: softmax and SDPA calls go to :class:`ModuleRun`."""

    def __init__(self, run: ModuleRun) -> None:
        super().__init__()
        self.run = run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SOFTMAXES:
            return self.run.softmax(func, args, kwargs)
        if func is _SDPA:
            return self.run.sdpa(args, kwargs)
        return func(*args, **kwargs)


@dataclass
class ModuleRun:
    """One run of a module under the seam: its recorder, run and layout, and the forward's
    batch size and token count (0 when unknown)."""

    recorder: Recorder
    run: Run
    layout: Layout
    batch: int
    tokens: int
    key_tokens: int

    def _check_shape(self, site: Site, weights: torch.Tensor) -> None:
        """Token attention has at most as many queries and keys as the forward has tokens
        (fewer when pooled, or in a cached step); anything else is another layout (block-local
        or global-token attention), which no ``[query, key]`` map would show truly."""
        q_len, k_len = weights.shape[-2:]
        if (self.tokens and q_len > self.tokens) or (self.key_tokens and k_len > self.key_tokens):
            raise AttentionUnavailableError(
                f"{site.path} computes weights over {q_len} × {k_len} positions for "
                f"{self.tokens} × {self.key_tokens} tokens: a layout (block-local or "
                "global-token attention) attnprobe cannot read as one [query, key] map")

    def _knocked_out(self, site: Site, scores: torch.Tensor) -> torch.Tensor:
        """Scores ``[batch, head, query, key]`` with the knockouts' blocked edges closed
        (keys the model closed stay closed; the row renormalises over the rest)."""
        low = torch.finfo(scores.dtype).min
        blocked = self.recorder.blocked(site, scores.shape, scores > low / 2)
        return scores if blocked is None else scores.masked_fill(blocked, low)

    def _take(self, site: Site, weights: torch.Tensor,
              scores: torch.Tensor | None) -> torch.Tensor:
        """Hand ``[batch, head, query, key]`` weights (and the scores they came from) to the
        recorder's parts; the weights as the rewriting parts left them."""
        recorder, n_heads = self.recorder, weights.shape[1]
        if scores is not None and recorder.takes("scores"):
            recorder.tensor(site, "scores", scores, n_heads)
        if recorder.takes("pattern"):
            weights = recorder.tensor(site, "pattern", weights, n_heads)
        recorder.consume(site, weights, 0, weights.shape[2])
        return weights

    def softmax(self, func: Callable[..., torch.Tensor], args: tuple,
                kwargs: dict) -> torch.Tensor:
        dim = _softmax_dim(args, kwargs)
        scores = None if dim is None else self.layout.read(args[0], dim, self.batch,
                                                           self.tokens)
        if scores is None:
            return func(*args, **kwargs)
        site = self.run.next_site()
        if not self.recorder.wants(site):
            return func(*args, **kwargs)
        self._check_shape(site, scores)
        if self.recorder.knockouts:
            if self.layout is not ROWS_LAST:
                raise InputError(f"a knockout at {site.path} needs [query, key] scores; this "
                                 f"module computes its attention as a {self.layout.name}")
            scores = self._knocked_out(site, scores)
            args = (self.layout.write(scores, args[0], dim, self.batch, self.tokens),
                    *args[1:])
        weights = func(*args, **kwargs)
        view = self.layout.read(weights, dim, self.batch, self.tokens)
        taken = self._take(site, view, scores)
        if taken is view:
            return weights
        return self.layout.write(taken, weights, dim, self.batch, self.tokens)

    def sdpa(self, args: tuple, kwargs: dict) -> torch.Tensor:
        given = _sdpa_arguments(args, kwargs)
        site = self.run.next_site()
        if not self.recorder.wants(site):
            return _SDPA(*args, **kwargs)
        query, value = given["query"], given["value"]
        scores = sdpa_scores(query, given["key"], given.get("attn_mask"),
                             bool(given.get("is_causal", False)), given.get("scale"))
        self._check_shape(site, scores)
        if self.recorder.knockouts:
            scores = self._knocked_out(site, scores)
        weights = self._take(site, torch.softmax(scores, dim=-1), scores)
        dropout = float(given.get("dropout_p", 0.0) or 0.0)
        if dropout:
            weights = nn.functional.dropout(weights, p=dropout, training=True)
        if value.shape[-3] != weights.shape[-3]:
            value = value.repeat_interleave(weights.shape[-3] // value.shape[-3], dim=-3)
        output = torch.matmul(weights.to(value.dtype), value)
        if not torch.isfinite(output).all():
            raise InputError(f"the edited weights at {site.path} overflow the model's "
                             f"{str(output.dtype).removeprefix('torch.')} when applied to the "
                             "values")
        return output


def _batch_and_tokens(recorder: Recorder, site: Site, args: tuple,
                      kwargs: dict) -> tuple[int, int, int]:
    """Batch size and the query and key sides' token counts of a module call: the forward's
    token ids say them (modules of some families take their input time-first), else the
    first tensor argument's first dimension (token counts unknown: 0)."""
    ids = recorder.current.ids
    queries, keys = ids.get(site.side), ids.get(site.key_side)
    if queries is not None:
        return (int(queries.shape[0]), int(queries.shape[-1]),
                int(keys.shape[-1]) if keys is not None else 0)
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim >= 2:
            return int(value.shape[0]), 0, 0
    return 0, 0, 0


@contextmanager
def module_seam(model: nn.Module, recorder: Recorder, sites: Sequence[Site]) -> Iterator[None]:
    """Read the weights of the modules at ``sites`` inside their own forwards (module
    docstring); every hook is removed on exit, also when the forward raised."""
    handles = []
    try:
        for site in sites:
            module = model.get_submodule(site.path)
            layout = LAYOUTS.get(type(module).__name__, ROWS_LAST)
            handles.append(module.register_forward_pre_hook(
                _on_start(recorder, site, layout), with_kwargs=True))
            handles.append(module.register_forward_hook(_on_end(recorder), always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _on_start(recorder: Recorder, base: Site, layout: Layout) -> Callable[..., None]:
    def start(module: nn.Module, args: tuple, kwargs: dict | None = None) -> None:
        # no kwargs: another thread's forward while the capture opens or closes (_record_inputs)
        if kwargs is None or not recorder.is_open:
            return
        run = recorder.start_run(module, base)
        recorder.ran.add(base)
        batch, tokens, key_tokens = _batch_and_tokens(recorder, base, args, kwargs)
        reader = _Reader(ModuleRun(recorder, run, layout, batch, tokens, key_tokens))
        reader.__enter__()
        recorder.readers[id(module)] = reader

    return start


def _on_end(recorder: Recorder) -> Callable[..., None]:
    def end(module: nn.Module, args: tuple, output: Any) -> None:
        if not recorder.is_open:  # another thread's forward: its end is not this run's
            return
        reader = recorder.readers.pop(id(module), None)
        if reader is not None:
            reader.__exit__(None, None, None)
        recorder.end_run(module)

    return end
