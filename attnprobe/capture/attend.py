"""The attention function the HuggingFace seam registers: what happens at a captured site.

transformers calls it for every attention module that routes through its attention interface
(``query`` ``[batch, head, q, d]``, ``key`` / ``value`` ``[batch, kv_head, k, d]``). For a
module no open capture asked for, it calls the model's original backend (SDPA by default), so
unscoped layers cost nothing extra. For a scoped module it runs, in named cases
(:func:`_attend`): the parts that read or rewrite q, k and v; a lean stand-in for a plain
KV-cache decoding step; else the model's *own* ``eager_attention_forward`` — so the weights are
exactly the eager ones, with every model quirk (GPT-2 scaling, T5 position bias, learned
sinks ...) — with knockouts in its mask, on all rows at once or on blocks of rows for
streaming reducers; then the weights and the per-head outputs go through the parts.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.capture.decode_step import lean_step, plain_step_kwargs, same_as_eager
from attnprobe.capture.recorder import Recorder, open_recorders
from attnprobe.capture.sites import Site
from attnprobe.capture.sparse_keys import fold_indices
from attnprobe.core.optional import require
from attnprobe.errors import AttentionUnavailableError, InputError

__all__ = ["BLOCK_BYTES", "MAPS_SHARE", "MIN_BLOCK_BYTES", "attnprobe_attention"]

# streaming: a layer whose weights take more than BLOCK_BYTES is read in blocks of rows of at
# most BLOCK_BYTES (larger blocks make every pass over them slower, smaller ones pay the
# statistics' fixed cost per block more often: 16 MiB was fastest at 16k and 32k tokens), and
# of at most 1/MAPS_SHARE of the layer's weights (but MIN_BLOCK_BYTES): what streaming holds
# stays a small share of what full maps would
BLOCK_BYTES = 16 * 2**20
MIN_BLOCK_BYTES = 2**20
MAPS_SHARE = 64
_EAGER_HOME: dict[type, Any] = {}  # attention class -> the module of its eager function


def _eager_of(module: nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The model's own eager attention function (defined next to its attention class; the
    module defining it is found once per class: a decoding step asks for every layer)."""
    home = _EAGER_HOME.get(type(module))
    fn = getattr(home, "eager_attention_forward", None) if home is not None else None
    if fn is not None:
        return fn
    for cls in type(module).__mro__:
        home = sys.modules.get(cls.__module__)
        fn = getattr(home, "eager_attention_forward", None)
        if fn is not None:
            _EAGER_HOME[type(module)] = home
            return fn
    raise AttentionUnavailableError(
        f"{type(module).__name__} has no eager_attention_forward in its module; "
        "capture it with paths=[...] instead")


def _backend(name: str, module: nn.Module) -> Callable[..., Any]:
    if name == "eager":
        return _eager_of(module)
    transformers = require("transformers")
    return transformers.AttentionInterface().get_interface(name, _eager_of(module))


def _additive_rows(mask: torch.Tensor | None, rows: slice, q_len: int, k_len: int,
                   causal: bool, dtype: torch.dtype, device: torch.device,
                   keys: slice | None = None) -> torch.Tensor | None:
    """Rows ``[batch|1, 1, rows, key]`` of the eager (additive) mask equivalent to ``mask``
    (only the columns ``keys``, when given).

    ``mask`` is what the delegate's mask function produced: boolean (True = attend),
    additive float, or None (then ``causal`` says whether SDPA would have used ``is_causal``).
    """
    if mask is None and not causal:
        return None
    low = torch.finfo(dtype).min
    keys = slice(0, k_len) if keys is None else keys
    if mask is None:
        q_idx = torch.arange(q_len, device=device)[rows, None]
        allowed = q_idx >= torch.arange(k_len, device=device)[None, keys]
        return torch.where(allowed, 0.0, low).to(dtype)[None, None]
    block = mask[..., rows, keys]
    if block.dtype == torch.bool:
        return torch.where(block, torch.zeros((), dtype=dtype, device=device), low)
    return block.to(dtype)


def _visible_keys(additive: torch.Tensor | None, q_valid: Callable[[], torch.Tensor],
                  rows: int, k_len: int, site: Site, span: list[slice] | None = None
                  ) -> torch.Tensor:
    """``[batch|1, rows]``: how many keys each query row may attend to under the mask; with
    ``span`` (a list), appends the keys some row may attend to (first to last open key).

    A real query row with no key left to attend to is an input error, not a uniform row.
    """
    if additive is None:
        if span is not None:
            span.append(slice(0, k_len))
        return torch.full((1, rows), k_len)
    open_keys = additive > torch.finfo(additive.dtype).min / 2  # [batch|1, 1|head, rows, key]
    visible = open_keys[:, 0].sum(-1).expand(-1, rows)
    if span is not None:
        columns = open_keys.flatten(0, -2).any(0).nonzero()
        span.append(slice(int(columns[0]), int(columns[-1]) + 1) if len(columns)
                    else slice(0, k_len))
    empty = visible == 0
    if empty.any():  # padding rows may be closed; a real token's row may not
        closed = empty & q_valid().to(visible.device)
        if closed.any():
            b, q = closed.nonzero()[0].tolist()
            raise InputError(f"query {q} of example {b} at {site.path} is fully masked "
                             "(no key it may attend to)")
    return visible.cpu()


def _note_learned_sink(takers: list[tuple[Recorder, Site]], module: nn.Module,
                       kwargs: dict[str, Any]) -> None:
    """Mark the sites whose softmax has a learned sink column that it drops (GPT-OSS's
    ``sinks``, passed as ``s_aux`` or ``sinks``): their rows sum to less than 1. Asked once
    per site (a decoding step asks every layer)."""
    recorder, site = takers[0]
    fact = (site, "learned_sink")
    sink = recorder.site_facts.get(fact)
    if sink is None:
        sink = recorder.site_facts[fact] = any(
            kwargs.get(name) is not None for name in ("s_aux", "sinks")) \
            or isinstance(getattr(module, "sinks", None), torch.Tensor)
    if sink:
        for taker, taker_site in takers:
            taker.learned_sinks.add(taker_site)


def _weights_times_values(pattern: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``[batch, head, q, k] @ [batch, kv_head, k, d]`` -> ``[batch, q, head, d]`` (GQA-aware)."""
    groups = pattern.shape[1] // value.shape[1]
    if groups > 1:
        value = value.repeat_interleave(groups, dim=1)
    return torch.matmul(pattern, value.to(pattern.dtype)).transpose(1, 2).contiguous()


def _decoding_step(takers: list[tuple[Recorder, Site]], module: nn.Module, query: torch.Tensor,
                   key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any]
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One unmasked KV-cache step through :func:`~attnprobe.capture.decode_step.lean_step`,
    once the site's first step showed it equal to the eager function (None: use eager)."""
    recorder, site = takers[0]
    fact = (site, "lean_step")
    verdict = recorder.site_facts.get(fact)
    if verdict is False:
        return None
    try:
        lean = lean_step(query, key, value, kwargs.get("scaling"))
    except RuntimeError:
        if verdict is None:  # a layout the stand-in does not fit: eager for this site
            recorder.site_facts[fact] = False
            return None
        raise
    if verdict is None:
        extra = {name: v for name, v in kwargs.items() if name not in ("is_causal", "dropout")}
        eager = _eager_of(module)(module, query, key, value, None, dropout=0.0, **extra)
        recorder.site_facts[fact] = verdict = same_as_eager(lean, eager)
        if not verdict:
            return None
    output, weights = lean
    visible = torch.full((1, 1), key.shape[2])
    for taker, taker_site in takers:
        taker.consume(taker_site, weights, 0, 1, visible)
    return output, weights


@dataclass
class _Eager:
    """The model's eager attention function with everything prepared for one call: the
    additive mask (in the dtype eager's own mask function uses: bit-identical weights),
    dropout taken out (weights are captured before it), the position bias cut per row
    block, and the capturing recorders' knockouts."""

    takers: list[tuple[Recorder, Site]]
    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attention_mask: torch.Tensor | None
    causal: bool
    dropout: float
    kwargs: dict[str, Any]

    @classmethod
    def prepare(cls, takers: list[tuple[Recorder, Site]], delegate: str, module: nn.Module,
                query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, kwargs: dict[str, Any]) -> _Eager:
        # SDPA's mask function hands over no mask for a plain causal batch: is_causal says it
        is_causal = kwargs.pop("is_causal", None)
        causal = False
        if delegate == "sdpa" and attention_mask is None:
            is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
            causal = bool(is_causal) and query.shape[2] > 1
        dropout = float(kwargs.pop("dropout", 0.0) or 0.0)
        dropout = dropout if module.training else 0.0
        return cls(takers, module, query, key, value, attention_mask, causal, dropout, kwargs)

    @property
    def site(self) -> Site:
        return self.takers[0][1]

    def mask_dtype(self) -> torch.dtype:
        recorder, site = self.takers[0]
        dtype = recorder.site_facts.get((site, "mask_dtype"))
        if dtype is None:  # the model's (also under autocast, where the query is lower)
            param = next(self.module.parameters(), None)
            dtype = param.dtype if param is not None and param.is_floating_point() \
                else self.query.dtype
            recorder.site_facts[(site, "mask_dtype")] = dtype
        return dtype

    def can_trim(self) -> bool:
        """Whether a block of rows may drop the keys its mask closes: no argument but the
        mask (and a position bias, cut alike) holds a value per (query, key) pair."""
        bias = self.kwargs.get("position_bias")
        k_len = self.key.shape[2]
        return all(not isinstance(v, torch.Tensor) or v.ndim < 3 or v.shape[-1] != k_len
                   or v is bias for v in self.kwargs.values())

    def run(self, rows: slice, trim: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Rows ``rows`` of the queries: output ``[batch, rows, head, d]``, weights ``[batch,
        head, rows, key]``, the keys each row could see ``[batch|1, rows]`` and the first
        key the weights hold: with ``trim``, only the keys from the first to the last one
        some row may see (a causal block of rows skips the keys after it)."""
        recorder, site = self.takers[0]
        batch, n_heads, q_len, _ = self.query.shape
        k_len = self.key.shape[2]
        keys = slice(0, k_len)
        if trim and self.attention_mask is None and self.causal:  # key j <= query i
            keys = slice(0, min(k_len, rows.stop))
        mask = _additive_rows(self.attention_mask, rows, q_len, k_len, self.causal,
                              self.mask_dtype(), self.query.device, keys)
        n_rows = len(range(q_len)[rows])
        span: list[slice] | None = [] if trim and self.attention_mask is not None else None
        if self.attention_mask is None and self.causal:  # row i sees keys 0..i
            first = range(q_len)[rows].start
            visible = torch.arange(first + 1, first + n_rows + 1).clamp(max=keys.stop)[None]
        else:
            visible = _visible_keys(mask, lambda: recorder.query_valid(site, batch, q_len)[
                :, rows], n_rows, keys.stop, site, span)
        if span:
            keys = span[0]
            mask = mask[..., keys]
        mask = self._knocked_out(mask, (batch, n_heads, n_rows, keys.stop - keys.start))
        extra = dict(self.kwargs)
        bias = extra.get("position_bias")
        if bias is not None and bias.shape[-2] == q_len:
            extra["position_bias"] = bias[..., rows, keys] if bias.shape[-1] == k_len \
                else bias[..., rows, :]
        key, value = self.key, self.value
        if keys != slice(0, k_len):
            key, value = key[:, :, keys], value[:, :, keys]
        output, weights = _eager_of(self.module)(self.module, self.query[:, :, rows], key,
                                                 value, mask, dropout=0.0, **extra)
        return output, weights, visible, keys.start

    def _knocked_out(self, mask: torch.Tensor | None, shape: tuple[int, ...]
                     ) -> torch.Tensor | None:
        """The additive mask with the knockouts' blocked edges closed (rows renormalise over
        the keys they keep; keys the model masks stay masked)."""
        if not any(taker.knockouts for taker, _ in self.takers):
            return mask
        low = torch.finfo(self.mask_dtype()).min
        allowed = None if mask is None else mask > low / 2
        blocked = None
        for taker, site in self.takers:
            if taker.knockouts:
                mine = taker.blocked(site, torch.Size(shape), allowed)
                blocked = mine if blocked is None or mine is None else blocked | mine
        if blocked is None:
            return mask
        base = torch.zeros(shape, dtype=self.mask_dtype(), device=self.query.device) \
            if mask is None else mask.expand(shape)
        return base.masked_fill(blocked.to(base.device), low)

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row at once: the weights go through the rewriting parts (edits), then to
        every part; the output is recomputed from edited weights, then per-head outputs go
        through their parts."""
        q_len = self.query.shape[2]
        output, weights, visible, _ = self.run(slice(0, q_len))
        n_heads = weights.shape[1]
        edited = False
        for taker, site in self.takers:
            if taker.takes("pattern"):
                weights = taker.tensor(site, "pattern", weights, n_heads)
                edited = edited or taker.rewrites("pattern")
            taker.consume(site, weights, 0, q_len, visible)
        if edited or self.dropout > 0:  # dropout when training, on the way to the values
            dropped = nn.functional.dropout(weights, p=self.dropout, training=True) \
                if self.dropout else weights
            output = _weights_times_values(dropped, self.value)
            if edited and not torch.isfinite(output).all():  # e.g. weights × values > 65504
                raise InputError(f"the edited weights at {self.site.path} overflow the "
                                 f"model's {str(output.dtype).removeprefix('torch.')} when "
                                 "applied to the values")
        for taker, site in self.takers:
            if taker.takes("z"):  # [batch, q, head, d] <-> per head [batch, head, q, d]
                output = taker.tensor(site, "z", output.transpose(1, 2), n_heads).transpose(1, 2)
        return output.contiguous(), weights

    def streamed(self, block: int, budget: int | None = None) -> tuple[torch.Tensor, None]:
        """Blocks of ``block`` query rows, handed to the parts as they come: a long input's
        ``[query, key]`` weights never exist whole. Each block holds only the keys its rows
        may see; ``budget`` (rows x keys per block): a causal block of early rows sees
        fewer keys, so it takes more rows, up to the same size."""
        q_len, k_len = self.query.shape[2], self.key.shape[2]
        trim = self.can_trim()
        outputs = []
        start = 0
        while start < q_len:
            rows = block
            if budget is not None and trim and self.attention_mask is None and self.causal:
                rows = max(block, int((math.sqrt(start * start + 4 * budget) - start) / 2))
            out, weights, visible, k_start = self.run(slice(start, start + rows), trim)
            for taker, site in self.takers:
                taker.consume(site, weights, start, q_len, visible, k_start, k_len)
            outputs.append(out)
            del weights
            start += rows
        return torch.cat(outputs, dim=1), None


def _hand_over_qkv(takers: list[tuple[Recorder, Site]], query: torch.Tensor,
                   key: torch.Tensor, value: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values to the parts that read or rewrite them (innermost capture
    first); what the rewriting parts left."""
    n_heads = query.shape[1]
    for taker, site in takers:
        if taker.takes("q"):
            query = taker.tensor(site, "q", query, n_heads)
        if taker.takes("k"):
            key = taker.tensor(site, "k", key, n_heads)
        if taker.takes("v"):
            value = taker.tensor(site, "v", value, n_heads)
    return query, key, value


def _attend(takers: list[tuple[Recorder, Site]], delegate: str, module: nn.Module,
            query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention for the recorders that asked for this site (innermost capture first), in
    named cases:

    1. queries, keys and values go to the parts that read or rewrite them;
    2. a KV-cache decoding step with nothing to mask or change runs a lean stand-in of the
       eager function (checked equal to it on the site's first step): generation stays fast;
    3. otherwise the model's own eager function, with knockouts in the mask: all rows at once
       when a part needs them (maps, edits, dropout, per-head outputs), or blocks of rows
       for streaming reducers on long inputs.
    """
    query, key, value = _hand_over_qkv(takers, query, key, value)
    _note_learned_sink(takers, module, kwargs)
    if query.shape[2] == 1 and attention_mask is None and delegate == "sdpa" \
            and plain_step_kwargs(kwargs) and not any(r.changes_forward or r.takes("z")
                                                      for r, _ in takers):
        stepped = _decoding_step(takers, module, query, key, value, kwargs)
        if stepped is not None:
            return stepped
    eager = _Eager.prepare(takers, delegate, module, query, key, value, attention_mask, kwargs)
    batch, n_heads, q_len, _ = query.shape
    per_row = batch * n_heads * key.shape[2] * query.element_size()  # bytes of weights
    budget = BLOCK_BYTES if per_row * q_len <= BLOCK_BYTES else \
        min(BLOCK_BYTES, max(MIN_BLOCK_BYTES, per_row * q_len // MAPS_SHARE))
    auto = max(1, budget // per_row)
    block = min(r.query_block or auto for r, _ in takers)
    whole = any(r.needs_whole or r.knockouts or r.takes("z") for r, _ in takers) \
        or eager.dropout > 0
    if whole or q_len <= block:
        return eager.whole()
    asked = any(r.query_block for r, _ in takers)  # rows per block the caller fixed
    return eager.streamed(block, None if asked else block * key.shape[2])


def attnprobe_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None, *,
                        delegate: str, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The registered attention function (``query`` ``[batch, head, q, d]``)."""
    attention_mask = fold_indices(attention_mask, key, kwargs)  # an indexer's key picks
    takers = []
    for recorder in reversed(open_recorders()):  # innermost capture first
        base = recorder.site_of(module) if recorder.site_of is not None else None
        if base is None:
            continue
        site = recorder.next_site(module, base, query)
        if recorder.needs_weights and recorder.wants(site):
            takers.append((recorder, site))
    if takers:
        return _attend(takers, delegate, module, query, key, value, attention_mask, **kwargs)
    return _backend(delegate, module)(module, query, key, value, attention_mask, **kwargs)
