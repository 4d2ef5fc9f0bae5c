"""``capture()``: the one context manager through which attention is read or edited."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture import hf, hooks
from attnprobe.capture.calls import BatchPatterns, StopForward
from attnprobe.capture.info import model_info
from attnprobe.capture.recorder import EditFn, Recorder
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError
from attnprobe.heads.reducers import Reducer, Tally
from attnprobe.types import AttentionMap


@dataclass
class Capture:
    """What a capture context produced; filled in when the context exits cleanly.

    Attributes:
        maps: one :class:`AttentionMap` per example (and per attention stack), padding
            stripped; empty when ``keep=False``. Assembled on first access, so a caller who
            only needs ``tally`` never pays for cutting per-example maps.
        tally: mergeable sums of the streaming reducers.
        sites: the attention sites that were captured.
        edits: per edited site, the largest change the edit made to the pattern.
        live: with ``live=True``, per forward call, each site's weights
            ``[batch, head, query, key]`` as computed (in the autograd graph, padding
            included); after ``backward()`` their ``.grad`` is ∂output/∂attention.
        values: with ``values=True``, per forward call, each site's value vectors
            ``[batch, head, key, d_head]`` (transformers models).
    """

    tally: Tally = field(default_factory=Tally)
    sites: list[Site] = field(default_factory=list)
    edits: pd.DataFrame = field(default_factory=pd.DataFrame)
    _assemble: Callable[[], list[AttentionMap]] | None = field(default=None, repr=False)
    _maps: list[AttentionMap] | None = field(default=None, repr=False)
    _batches: Callable[[], list[BatchPatterns]] | None = field(default=None, repr=False)
    live: list[dict[Site, torch.Tensor]] = field(default_factory=list)
    values: list[dict[Site, torch.Tensor]] = field(default_factory=list)

    @property
    def maps(self) -> list[AttentionMap]:
        if self._maps is None:
            self._maps = self._assemble() if self._assemble is not None else []
            self._assemble = None
        return self._maps

    def batches(self) -> list[BatchPatterns]:
        """The kept weights per forward call and (stack, kind), still padded:
        ``[batch, layer, head, query, key]`` with validity masks. Cheaper than :attr:`maps`
        for batched analyses; call it before reading ``maps`` (which releases the tensors)."""
        return self._batches() if self._batches is not None and self._maps is None else []

    @property
    def stats(self) -> pd.DataFrame:
        """Tidy reducer results (``attnprobe.heads.reducers.STAT_COLUMNS``)."""
        return self.tally.to_frame()


def _tensor_arg(args: tuple, kwargs: dict, name: str, position: int | None) -> Any:
    if name in kwargs:
        return kwargs[name]
    if position is not None and len(args) > position and isinstance(args[position], torch.Tensor):
        return args[position]
    return None


def _record_inputs(recorder: Recorder) -> Callable[..., None]:
    """Root pre-hook: note token ids and padding of every forward call."""

    def on_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = _tensor_arg(args, kwargs, "input_ids", 0)
        mask = _tensor_arg(args, kwargs, "attention_mask", 1)
        # with a KV cache the mask also covers the cached tokens, so it may be longer than ids
        if not (isinstance(mask, torch.Tensor) and mask.ndim == 2
                and (not isinstance(ids, torch.Tensor) or ids.ndim != 2
                     or (mask.shape[0] == ids.shape[0] and mask.shape[1] >= ids.shape[1]))):
            mask = None
        dec_ids = kwargs.get("decoder_input_ids")
        dec_mask = kwargs.get("decoder_attention_mask")

        def two_d(t: Any) -> torch.Tensor | None:
            return t.detach().cpu() if isinstance(t, torch.Tensor) and t.ndim == 2 else None

        recorder.begin_call(
            ids={"main": two_d(ids), "decoder": two_d(dec_ids)},
            valid={"main": None if two_d(mask) is None else two_d(mask).bool(),
                   "decoder": None if two_d(dec_mask) is None else two_d(dec_mask).bool()})

    return on_call


def _causal(model: nn.Module, sites: Sequence[Site]) -> bool | None:
    flags = [getattr(model.get_submodule(s.path), "is_causal", None) for s in sites
             if s.kind == "self"]
    flags = [f for f in flags if isinstance(f, bool)]
    return any(flags) if flags else None


@contextmanager
def capture(model: nn.Module, *, layers: Sequence[int] | int | None = None,
            heads: Sequence[int] | int | None = None, paths: Sequence[str] | None = None,
            keep: bool = True, reducers: Sequence[Reducer] | None = None,
            edit: EditFn | None = None, scores: bool = False, tokenizer: Any = None,
            example_ids: Sequence[str] | None = None,
            query_block: int | None = None, live: bool = False,
            values: bool = False, stop_early: bool = False,
            edit_output: EditFn | None = None) -> Iterator[Capture]:
    """Capture (and optionally edit) attention of every forward run inside the context.

    Args:
        model: a transformers model (any attention backend, SDPA included), an attnprobe
            reference model, or any module with pattern-producing submodules (``paths``).
        layers / heads: model indices to capture; ``None`` means all. Other layers run
            their original (fast) attention; other heads are not kept.
        paths: module paths whose outputs are ``[batch, head, query, key]`` patterns
            (e.g. ``blocks.0.attn.hook_pattern`` of a TransformerLens model).
        keep: keep the maps (``cap.maps``). With ``keep=False`` only ``reducers`` run, on
            blocks of query rows (``query_block`` rows, or as many as fit in 16 MiB), so
            memory stays flat for long inputs.
        reducers: streaming statistics (``attnprobe.heads.reducers``) fed as weights appear.
        edit: ``edit(layer, pattern) -> pattern`` applied to requested layers between the
            softmax and the values; the context checks it changed something.
        scores: also keep pre-softmax scores (``AttentionMap.scores``); needs
            ``hook_scores`` modules next to the patterns, as attnprobe's reference models have.
        tokenizer: used to turn ids into token strings (``convert_ids_to_tokens``).
        live: keep each site's weights in the autograd graph and retain their gradients
            (``cap.live``), e.g. for attention × gradient.
        values: keep each site's value vectors (``cap.values``), e.g. for the norm-based
            view ``‖α f(x)‖``.
        edit_output: ``edit_output(layer, output) -> output`` on each requested layer's
            per-head outputs ``[batch, head, query, d_head]`` (weights times values, before
            the output projection), e.g. mean-ablation; transformers models.
        stop_early: end the forward as soon as the last requested attention site has been
            read (e.g. skip the last layer's feed-forward): for analyses of attention only.
            The forward call then returns no output — the statement after it inside the
            ``with`` block does not run — and the context exits normally.

    Yields:
        A :class:`Capture`, filled when the context exits without error.

    Example:
        >>> with ap.capture(model, layers=[2], heads=[0, 8]) as cap:
        ...     model(**batch)
        >>> cap.maps[0].pattern.shape   # [layer, head, query, key] = [1, 2, n, n]
    """
    recorder = Recorder(layers=layers, heads=heads, keep=keep, reducers=reducers, edit=edit,
                        query_block=query_block, live=live, values=values,
                        edit_output=edit_output)
    result = Capture()
    use_hf = paths is None and hf.is_hf_model(model)
    with ExitStack() as stack:
        if use_hf:
            if scores:
                raise InputError("scores=True works on models with hook_scores modules "
                                 "(reference models); transformers models expose only weights")
            sites = stack.enter_context(hf.hf_seam(model, recorder))
            implementation = "eager (attnprobe seam)"
        else:
            sites = stack.enter_context(hooks.path_seam(model, recorder, paths, scores=scores))
            implementation = "hooks"
        handle = model.register_forward_pre_hook(_record_inputs(recorder), with_kwargs=True)
        stack.callback(handle.remove)
        if stop_early and sites:
            recorder.stop_after = sites[-1]  # sites come in the order the forward runs them
        try:
            yield result
        except StopForward:
            if not stop_early:
                raise
    recorder.finish(sites)
    tokens_of = getattr(tokenizer, "convert_ids_to_tokens", None)
    info = model_info(model, implementation=implementation, n_layers=recorder.n_layers,
                      n_heads=recorder.n_heads, causal=_causal(model, sites))
    to_tokens = (lambda ids: tokens_of(ids.tolist())) if tokens_of else None
    result._assemble = partial(recorder.build_maps, info, to_tokens, example_ids)
    result._batches = recorder.batch_patterns
    result.tally = recorder.tally
    result.sites = list(sites)
    result.edits = recorder.edits_frame()
    result.live = [call.live for call in recorder.calls if call.live]
    result.values = [call.values for call in recorder.calls if call.values]
