"""``capture()``: the one context manager through which attention is read or edited."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Unpack

import pandas as pd
import torch
from torch import nn

from attnprobe.capture import discovery, hf, hooks
from attnprobe.capture.assemble import Stacked, batch_patterns, build_maps, stack_calls
from attnprobe.capture.calls import BatchPatterns, StopForward
from attnprobe.capture.extra_keys import extra_keys_of
from attnprobe.capture.flags import Flags, given_flags, parts_from_flags
from attnprobe.capture.info import model_info
from attnprobe.capture.parts import Part
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.sites import Site
from attnprobe.capture.steps import cache_rows
from attnprobe.core.display import counted, describe, indices
from attnprobe.core.reducers import Tally
from attnprobe.core.residence import input_device
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap


@dataclass
class Capture:
    """What a capture context produced; filled in when the context exits cleanly.

    Attributes:
        maps: one :class:`AttentionMap` per example (and per attention stack), padding
            stripped; empty when ``keep=False``. Assembled on first access, so a caller who
            only needs ``tally`` never pays for cutting per-example maps.
        tally: mergeable sums of the streaming reducers, per head of the scope.
        sites: the attention sites that were captured.
        edits: per edited site (``stack, kind, layer, path``), the largest change the edit
            made (``max_abs_change``), measured against the weights before the edit.
        live: with ``live=True``, per forward call, each scoped site's weights
            ``[batch, head, query, key]`` (every head) as computed (in the autograd graph,
            padding included); after ``backward()`` their ``.grad`` is ∂output/∂attention.
        values: with ``values=True``, per forward call, each scoped site's value vectors
            ``[batch, head, key, d_head]`` (every head; transformers models).
        activations: with the :class:`~attnprobe.capture.parts.Activations` part, per
            forward call, each scoped site's ``{"q" | "k" | "v" | "z": tensor}``.
        runs: one row per captured layer (``stack, kind, layer, path, call``), in the order
            they first ran: which module computed it and which of its runs in the forward it
            was (``call`` > 0 for modules that run several times per forward, e.g. ALBERT's
            shared layer; :mod:`attnprobe.capture.runs`).
    """

    tally: Tally = field(default_factory=Tally)
    sites: list[Site] = field(default_factory=list)
    edits: pd.DataFrame = field(default_factory=pd.DataFrame)
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    live: list[dict[Site, torch.Tensor]] = field(default_factory=list)
    values: list[dict[Site, torch.Tensor]] = field(default_factory=list)
    activations: list[dict[Site, dict[str, torch.Tensor]]] = field(default_factory=list)
    # what the recorder kept, stacked once on first use (maps and batches share the tensors)
    _stack: Callable[[], list[Stacked]] | None = field(default=None, repr=False)
    _stacked: list[Stacked] | None = field(default=None, repr=False)
    _build_maps: Callable[[list[Stacked]], list[AttentionMap]] | None = \
        field(default=None, repr=False)
    _maps: list[AttentionMap] | None = field(default=None, repr=False)
    _kept_heads: dict[Site, tuple[int, ...]] = field(default_factory=dict, repr=False)
    _sink_sites: frozenset[Site] = field(default=frozenset(), repr=False)

    def _groups(self) -> list[Stacked]:
        if self._stacked is None:
            self._stacked = self._stack() if self._stack is not None else []
            self._stack = None
        return self._stacked

    @property
    def maps(self) -> list[AttentionMap]:
        """The kept weights as one map per example (built, and validated, on first read)."""
        if self._maps is None:
            groups = self._groups()
            self._maps = self._build_maps(groups) if self._build_maps is not None else []
        return self._maps

    def batches(self) -> list[BatchPatterns]:
        """The kept weights per forward call and (stack, kind), still padded:
        ``[batch, layer, head, query, key]`` with validity masks; cheaper than :attr:`maps`
        for batched analyses (before or after reading ``maps``: both share one copy)."""
        return batch_patterns(self._groups(), self._kept_heads, self._sink_sites)

    @property
    def stats(self) -> pd.DataFrame:
        """Tidy reducer results (``attnprobe.core.reducers.STAT_COLUMNS``)."""
        return self.tally.to_frame()

    def __repr__(self) -> str:
        groups: dict[tuple[str, str], list[int]] = {}
        for site in self.sites:
            groups.setdefault((site.stack, site.kind), []).append(site.layer)
        where = "; ".join(f"{stack} {kind} {indices(layers)}"
                          for (stack, kind), layers in list(groups.items())[:3])
        maps = counted(len(self._maps), "map") if self._maps is not None else \
            "maps built on first read" if self._build_maps is not None else None
        stats = len({stat for stat, _ in self.tally.sums})
        return describe(
            "Capture", f"{counted(len(self.sites), 'site')}" + (f" ({where})" if where else ""),
            maps, f"tally of {counted(stats, 'statistic')}" if stats else None,
            counted(len(self.edits), "edited site") if len(self.edits) else None,
            f"live weights of {counted(len(self.live), 'forward')}" if self.live else None,
            f"values of {counted(len(self.values), 'forward')}" if self.values else None)


def _tensor_arg(args: tuple, kwargs: dict, name: str, position: int | None) -> Any:
    if name in kwargs:
        return kwargs[name]
    if position is not None and len(args) > position and isinstance(args[position], torch.Tensor):
        return args[position]
    return None


def _cached_tokens(kwargs: dict, side: str) -> dict[str, int]:
    """``{side: n}``: how many tokens the KV cache handed to this forward already holds
    (transformers passes it as ``cache`` or ``past_key_values``); empty when unknown."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    length = getattr(cache, "get_seq_length", None)
    if not callable(length):
        return {}
    try:
        n = length()
    except (TypeError, ValueError, IndexError, AttributeError):  # a cache of another kind
        return {}
    return {side: int(n)} if isinstance(n, int) else {}


def _record_inputs(recorder: Recorder) -> Callable[..., None]:
    """Root pre-hook: note token ids and padding of every forward call of this thread."""

    def on_call(module: nn.Module, args: tuple, kwargs: dict | None = None) -> None:
        # torch copies a module's hooks, then asks of each whether it takes kwargs: a
        # forward of another thread while this capture opens or closes calls it without
        if kwargs is None or not recorder.is_open:
            return
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
                   "decoder": None if two_d(dec_mask) is None else two_d(dec_mask).bool()},
            cached=_cached_tokens(kwargs, "decoder" if dec_ids is not None else "main"),
            cache_rows=cache_rows(kwargs.get("cache", kwargs.get("past_key_values"))))

    return on_call


def _causal(model: nn.Module, sites: Sequence[Site]) -> bool | None:
    flags = [getattr(model.get_submodule(s.path), "is_causal", None) for s in sites
             if s.kind == "self"]
    flags = [f for f in flags if isinstance(f, bool)]
    return any(flags) if flags else None


def _chosen_parts(parts: Sequence[Part] | None, flags: dict[str, Any],
                  seams: Sequence[str]) -> list[Part]:
    """The capture's parts, checked before any forward: parts or flags (not both), each a
    part the seam serves, each given once, each next to the parts it needs."""
    if parts is None:
        chosen = parts_from_flags(flags)
    else:
        given = given_flags(flags)
        if given:
            raise InputError(f"give parts=[...] or the keyword flags ({', '.join(given)}), "
                             "not both")
        if isinstance(parts, Part) or not isinstance(parts, Sequence):
            raise InputError("parts must be a list of capture parts, e.g. [Keep()]")
        chosen = list(parts)
    for part in chosen:
        if not isinstance(part, Part):
            raise InputError(f"parts must be capture parts (Keep, Reduce, Edit, ...); got "
                             f"{type(part).__name__}")
        for seam in seams:
            part.check_seam(seam)
    names = [part.name for part in chosen]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InputError(f"each part at most once; {', '.join(twice)} given twice (compose "
                         "edit functions, or give one Reduce all the reducers)")
    for part in chosen:
        missing = [name for name in part.needs if name not in names]
        if missing:
            raise InputError(f"{part.name} needs the {', '.join(missing)} part too")
    return chosen


def _weights_dtype(recorder: Recorder) -> str | None:
    """The least precise dtype the weights were computed in (autocast may differ from the
    parameters'); it sets how far a row may be off 1."""
    floats = [d for d in recorder.dtypes if d.is_floating_point]
    if not floats:
        return None
    return str(max(floats, key=lambda d: torch.finfo(d).eps)).removeprefix("torch.")


def _scope_of(scope: ScopeLike, layers: Sequence[int] | int | None,
              heads: Sequence[int] | int | None) -> Scope:
    if (layers is not None or heads is not None) and scope is not None:
        raise InputError("give scope= or layers=/heads=, not both")
    if scope is not None:
        return Scope.parse(scope)
    return Scope(layers, heads)


_IMPLEMENTATIONS = {"hf": "eager (attnprobe seam)", "modules": "own modules (attnprobe seam)"}


def _expected_layers(recorder: Recorder, sites: Sequence[Site]) -> set[tuple[str, str, int]]:
    """``Site.key`` of every layer a forward reads before ``stop_early`` may end it: the
    scoped sites, and every scoped depth of a stack whose modules run more than once."""
    keys = {site.key for site in sites}
    for (stack, kind), depth in recorder.layer_counts.items():
        modules = [site for site in sites if (site.stack, site.kind) == (stack, kind)]
        if modules and len(modules) < depth:
            keys |= {(stack, kind, layer) for layer in range(depth)
                     if recorder.scope.wants_layer(layer)}
    return keys


def _seams(model: nn.Module, paths: Sequence[str] | None) -> tuple[str, ...]:
    """The seams (:data:`~attnprobe.capture.parts.SEAMS`) this capture goes through."""
    if paths is not None:
        return ("paths",)
    return discovery.seams_of(model) if hf.is_hf_model(model) else ("hook_points",)


@contextmanager
def capture(model: nn.Module, scope: ScopeLike = None, *, parts: Sequence[Part] | None = None,
            layers: Sequence[int] | int | None = None,
            heads: Sequence[int] | int | None = None, paths: Sequence[str] | None = None,
            tokenizer: Any = None, example_ids: Sequence[str] | None = None,
            stop_early: bool = False, **flags: Unpack[Flags]) -> Iterator[Capture]:
    """Capture (and optionally edit) attention of every forward run inside the context.

    The core is a model and a scope; what happens to the weights is a list of parts
    (:mod:`attnprobe.capture.parts`), given as ``parts=[...]``. The keyword flags below are
    a shorthand that builds the parts (:mod:`attnprobe.capture.flags`); without either, the
    capture keeps the maps (``[Keep()]``).

    Args:
        model: a transformers model (any attention backend, SDPA included), an attnprobe
            reference model, or any module with pattern-producing submodules (``paths``).
        scope: which heads (:mod:`attnprobe.core.scope`: ``"layer:3"``, ``"heads:0.2,1.8"``
            ...; default every head). Layers out of scope run their original (fast)
            attention. ``layers=`` / ``heads=`` give a layers × heads scope instead.
        parts: the parts to run (e.g. ``[Keep(), Reduce(reducers)]``); exclusive with the
            flags below. Each part at most once.
        paths: module paths whose outputs are ``[batch, head, query, key]`` patterns
            (e.g. ``blocks.0.attn.hook_pattern`` of a TransformerLens model).
        tokenizer: turns ids into token strings (``convert_ids_to_tokens``).
        example_ids: ``example_id`` of each example's map, in batch order.
        stop_early: end the forward as soon as the last scoped attention site has been read
            (e.g. skip the last layer's feed-forward): for analyses of attention only. The
            forward call then returns no output — the statement after it inside the ``with``
            block does not run — and the context exits normally.
        **flags: shorthand for ``parts``, one part each (:mod:`attnprobe.capture.flags`):
            ``keep`` (:class:`~attnprobe.capture.parts.Keep`: the maps, ``cap.maps``;
            default True unless ``parts`` are given); ``reducers`` / ``query_block``
            (:class:`~attnprobe.capture.parts.Reduce`: streaming statistics, ``cap.tally``;
            with ``keep=False`` on blocks of query rows, so memory stays flat for long
            inputs); ``edit`` (:class:`~attnprobe.capture.rewrites.Edit`: ``edit(layer,
            pattern) -> pattern`` between the softmax and the values, on a copy — editing it
            in place and returning it works; only the scope's heads take the result, and the
            context checks it changed something); ``edit_output``
            (:class:`~attnprobe.capture.rewrites.EditOutput`: ``edit_output(layer, output)
            -> output`` on per-head outputs ``[batch, head, query, d_head]``); ``live``
            (:class:`~attnprobe.capture.parts.Live`: weights in the autograd graph,
            ``cap.live``, e.g. for attention × gradient); ``values``
            (:class:`~attnprobe.capture.parts.Values`: value vectors, ``cap.values``);
            ``scores`` (:class:`~attnprobe.capture.parts.Scores`: pre-softmax scores,
            ``AttentionMap.scores``; hook-point models).

    Yields:
        A :class:`Capture`, filled when the context exits without error.

    Raises:
        InputError: before any forward, for a scope out of range, a part the model's seam
            cannot serve (e.g. ``values=True`` on a reference model), a part given twice, or
            ``parts=`` together with the flags.
        TypeError: a keyword that is neither a parameter nor a flag.

    A capture takes only the forwards run in the thread that opened it, so captures of one
    model in several threads (overlapping in any order) each see their own; the model's
    attention implementation is restored when the last of them exits, also on an error or
    Ctrl-C.

    Example:
        >>> with ap.capture(model, "heads:2.0,2.8") as cap:
        ...     model(**batch)
        >>> cap.maps[0].pattern.shape   # [layer, head, query, key] = [1, 2, n, n]
    """
    input_device(model)  # a weight on 'meta' that no offload hook loads: one line, now
    seams = _seams(model, paths)
    recorder = Recorder(_scope_of(scope, layers, heads), _chosen_parts(parts, flags, seams))
    result = Capture()
    with ExitStack() as stack:
        if paths is None and hf.is_hf_model(model):
            sites = stack.enter_context(hf.hf_seam(model, recorder))
            implementation = " + ".join(_IMPLEMENTATIONS[seam] for seam in seams)
        else:
            sites = stack.enter_context(hooks.path_seam(model, recorder, paths))
            implementation = "hooks"
        handle = model.register_forward_pre_hook(_record_inputs(recorder), with_kwargs=True)
        stack.callback(handle.remove)
        if stop_early and sites:
            recorder.stop_at = frozenset(_expected_layers(recorder, sites))
        stack.enter_context(recorder.opened())
        try:
            yield result
        except StopForward:
            if not stop_early:
                raise
    recorder.finish(sites)
    tokens_of = getattr(tokenizer, "convert_ids_to_tokens", None)
    info = model_info(model, implementation=implementation, n_layers=recorder.n_layers,
                      n_heads=recorder.n_heads, causal=_causal(model, sites),
                      dtype=_weights_dtype(recorder), tokenizer=tokenizer)
    to_tokens = (lambda ids: tokens_of(ids.tolist())) if tokens_of else None
    extra = extra_keys_of(model, sites)
    result._stack = lambda: stack_calls(recorder.sequences(), originals=recorder.calls)
    result._build_maps = lambda groups: build_maps(
        groups, recorder.kept_heads, set(recorder.edit_changes), info, to_tokens, example_ids,
        sink_sites=frozenset(recorder.learned_sinks), extra=extra)
    result._kept_heads = recorder.kept_heads
    result._sink_sites = frozenset(recorder.learned_sinks)
    result.runs = pd.DataFrame(
        [(s.stack, s.kind, s.layer, s.path, s.call) for s in recorder.fired],
        columns=["stack", "kind", "layer", "path", "call"])
    result.tally = recorder.tally
    result.sites = list(sites)
    result.edits = pd.DataFrame(
        [(s.stack, s.kind, s.layer, s.path, c) for s, c in recorder.edit_changes.items()],
        columns=["stack", "kind", "layer", "path", "max_abs_change"])
    result.live = [call.live for call in recorder.calls if call.live]
    result.values = [call.values for call in recorder.calls if call.values]
    result.activations = [call.activations for call in recorder.calls if call.activations]
