"""The HuggingFace seam: an attention function in transformers' AttentionInterface.

For the duration of a context the model is switched to ``attnprobe_<backend>``, an attention
function registered together with its mask function (without the mask function transformers
silently drops the causal mask for unknown implementation names). The function:

- runs the model's original backend (SDPA by default) for layers that were not asked for, so
  they cost nothing extra;
- runs the model's *own* ``eager_attention_forward`` for requested layers, so the weights are
  exactly the eager ones (with every model quirk: GPT-2 scaling, T5 position bias, ...);
- when only reducers are needed, runs that eager function on blocks of query rows, so a
  ``[query, key]`` matrix of a long input never exists whole;
- applies the caller's edit between the softmax and the values.

Per-capture state lives in the recorders open in the calling thread (a ContextVar), never on
the model. The implementation switch is reference-counted per model and the registration per
name, so overlapping captures (nested, or in several threads, in any order) restore the model
and remove the registration when the last of them exits — also on an error or Ctrl-C.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

from attnprobe.capture.decode_step import lean_step, plain_step_kwargs, same_as_eager
from attnprobe.capture.discovery import can_switch, layer_depths, site_ways
from attnprobe.capture.module_seam import module_seam
from attnprobe.capture.recorder import Recorder, open_recorders
from attnprobe.capture.sites import Site
from attnprobe.core.optional import require
from attnprobe.errors import AttentionUnavailableError, InputError

PREFIX = "attnprobe_"
DELEGATES = ("sdpa", "eager")  # original backends we can hand unrequested layers to
BLOCK_BYTES = 16 * 2**20  # streaming: size of one block of weights, whatever the input length
_EAGER_HOME: dict[type, Any] = {}  # attention class -> the module of its eager function


class _Sites:
    """Which module of one captured model is which attention site (by module identity)."""

    def __init__(self, model: nn.Module, sites: list[Site]) -> None:
        self.sites = {id(model.get_submodule(site.path)): site for site in sites}

    def site_of(self, module: nn.Module) -> Site | None:
        return self.sites.get(id(module))


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
                   causal: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """Rows ``[batch|1, 1, rows, key]`` of the eager (additive) mask equivalent to ``mask``.

    ``mask`` is what the delegate's mask function produced: boolean (True = attend),
    additive float, or None (then ``causal`` says whether SDPA would have used ``is_causal``).
    """
    if mask is None and not causal:
        return None
    low = torch.finfo(dtype).min
    if mask is None:
        q_idx = torch.arange(q_len, device=device)[rows, None]
        allowed = q_idx >= torch.arange(k_len, device=device)[None, :]
        return torch.where(allowed, 0.0, low).to(dtype)[None, None]
    block = mask[..., rows, :]
    if block.dtype == torch.bool:
        return torch.where(block, torch.zeros((), dtype=dtype, device=device), low)
    return block.to(dtype)


def _visible_keys(additive: torch.Tensor | None, q_valid: Callable[[], torch.Tensor],
                  rows: int, k_len: int, site: Site) -> torch.Tensor:
    """``[batch|1, rows]``: how many keys each query row may attend to under the mask.

    A real query row with no key left to attend to is an input error, not a uniform row.
    """
    if additive is None:
        return torch.full((1, rows), k_len)
    open_keys = additive > torch.finfo(additive.dtype).min / 2  # [batch|1, 1|head, rows, key]
    visible = open_keys[:, 0].sum(-1).expand(-1, rows)
    empty = visible == 0
    if empty.any():  # padding rows may be closed; a real token's row may not
        closed = empty & q_valid().to(visible.device)
        if closed.any():
            b, q = closed.nonzero()[0].tolist()
            raise InputError(f"query {q} of example {b} at {site.path} is fully masked "
                             "(no key it may attend to)")
    return visible.cpu()


def _has_learned_sink(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether the module's softmax has a learned sink column that it drops (GPT-OSS's
    ``sinks``, passed as ``s_aux`` or ``sinks``): its rows then sum to less than 1."""
    return any(kwargs.get(name) is not None for name in ("s_aux", "sinks")) \
        or isinstance(getattr(module, "sinks", None), torch.Tensor)


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
        taker.consume_values(taker_site, value, query.shape[1])
        taker.consume(taker_site, weights, 0, 1, visible)
    return output, weights


def _attend(takers: list[tuple[Recorder, Site]], delegate: str, module: nn.Module,
            query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eager attention for the recorders that asked for this site (innermost capture first)."""
    recorder, site = takers[0]
    batch, _, q_len, _ = query.shape
    k_len = key.shape[2]
    if q_len == 1 and attention_mask is None and delegate == "sdpa" \
            and plain_step_kwargs(kwargs) and not any(
                r.edit is not None or r.edit_output is not None for r, _ in takers):
        stepped = _decoding_step(takers, module, query, key, value, kwargs)
        if stepped is not None:
            return stepped
    if delegate == "sdpa" and attention_mask is None:
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        causal = bool(is_causal) and q_len > 1
    else:
        causal = False
    kwargs.pop("is_causal", None)
    # Weights are captured (and edited) before dropout; dropout, when training, is applied
    # here on the way to the values, as eager would.
    dropout = float(kwargs.pop("dropout", 0.0) or 0.0)
    dropout = dropout if module.training else 0.0
    eager = _eager_of(module)
    position_bias = kwargs.pop("position_bias", None)
    if _has_learned_sink(module, kwargs):
        for taker, taker_site in takers:
            taker.learned_sinks.add(taker_site)

    # the additive mask in the dtype eager's mask function would use (the model's, also under
    # autocast, where the query is lower precision): the same weights as eager, bit for bit
    mask_dtype = recorder.site_facts.get((site, "mask_dtype"))
    if mask_dtype is None:
        param = next(module.parameters(), None)
        mask_dtype = param.dtype if param is not None and param.is_floating_point() \
            else query.dtype
        recorder.site_facts[(site, "mask_dtype")] = mask_dtype

    def run(rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mask = _additive_rows(attention_mask, rows, q_len, k_len, causal, mask_dtype,
                              query.device)
        n_rows = len(range(q_len)[rows])
        # which rows are real tokens is read only when a mask could close a row
        visible = _visible_keys(mask, lambda: recorder.query_valid(site, batch, q_len)[:, rows],
                                n_rows, k_len, site)
        extra = dict(kwargs)
        if position_bias is not None:
            extra["position_bias"] = position_bias[..., rows, :] \
                if position_bias.shape[-2] == q_len else position_bias
        output, weights = eager(module, query[:, :, rows], key, value, mask, dropout=0.0, **extra)
        return output, weights, visible

    for taker, taker_site in takers:
        taker.consume_values(taker_site, value, query.shape[1])
    whole = any(r.needs_whole for r, _ in takers) or dropout > 0
    auto = max(1, BLOCK_BYTES // (batch * query.shape[1] * k_len * query.element_size()))
    block = min(r.query_block or auto for r, _ in takers)
    if whole or q_len <= block:
        output, weights, visible = run(slice(0, q_len))
        edited = False
        for taker, taker_site in takers:
            if taker.edit is not None:
                weights = taker.apply_edit(taker_site, weights)
                edited = True
            taker.consume(taker_site, weights, 0, q_len, visible)
        if edited or dropout > 0:
            dropped = nn.functional.dropout(weights, p=dropout, training=True) if dropout \
                else weights
            output = _weights_times_values(dropped, value)
            if edited and not torch.isfinite(output).all():  # e.g. weights × values > 65504
                raise InputError(f"the edited weights at {site.path} overflow the model's "
                                 f"{str(output.dtype).removeprefix('torch.')} when applied to "
                                 "the values")
        for taker, taker_site in takers:
            if taker.edit_output is not None:  # [batch, q, head, d] -> per head [b, h, q, d]
                heads_first = output.transpose(1, 2)
                output = taker.apply_output_edit(taker_site, heads_first).transpose(1, 2)
        return output.contiguous(), weights
    outputs = []
    for start in range(0, q_len, block):
        out, weights, visible = run(slice(start, start + block))
        for taker, taker_site in takers:
            taker.consume(taker_site, weights, start, q_len, visible)
        outputs.append(out)
        del weights
    return torch.cat(outputs, dim=1), None


def attnprobe_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None, *,
                        delegate: str, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The registered attention function (``query`` ``[batch, head, q, d]``)."""
    takers = []
    for recorder in reversed(open_recorders()):  # innermost capture first
        base = recorder.site_of(module) if recorder.site_of is not None else None
        if base is None:
            continue
        site = recorder.next_site(module, base)
        if recorder.needs_weights and recorder.wants(site):
            takers.append((recorder, site))
    if takers:
        return _attend(takers, delegate, module, query, key, value, attention_mask, **kwargs)
    return _backend(delegate, module)(module, query, key, value, attention_mask, **kwargs)


_REGISTERED: dict[str, int] = {}  # name -> number of open contexts using it
_REGISTRY_LOCK = threading.Lock()


@contextmanager
def _registered(delegate: str) -> Iterator[str]:
    """Register ``attnprobe_<delegate>`` (attention + mask function) while any context needs it.

    transformers has no public unregister; removal uses the class-wide mapping that
    ``register`` writes to (and that masking_utils itself reads).
    """
    transformers = require("transformers")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = PREFIX + delegate
    with _REGISTRY_LOCK:
        if not _REGISTERED.get(name):
            transformers.AttentionInterface.register(
                name, partial(attnprobe_attention, delegate=delegate))
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[delegate])
        _REGISTERED[name] = _REGISTERED.get(name, 0) + 1
    try:
        yield name
    finally:
        with _REGISTRY_LOCK:
            _REGISTERED[name] -= 1
            if not _REGISTERED[name]:
                transformers.AttentionInterface._global_mapping.pop(name, None)
                AttentionMaskInterface._global_mapping.pop(name, None)


def is_hf_model(model: nn.Module) -> bool:
    if "transformers" not in sys.modules:
        return False
    return isinstance(model, sys.modules["transformers"].PreTrainedModel)


def _configs(model: nn.Module) -> list[Any]:
    """Every config object of the model, its sub-models and (recursively) their sub-configs:
    ``set_attn_implementation`` may change any of them."""
    found: dict[int, Any] = {}
    todo = [getattr(sub, "config", None) for sub in model.modules()]
    while todo:
        config = todo.pop()
        if config is None or id(config) in found \
                or not hasattr(config, "_attn_implementation_internal"):
            continue
        found[id(config)] = config
        todo.extend(getattr(config, key, None) for key in getattr(config, "sub_configs", {}) or {})
    return list(found.values())


# id(model) -> [saved (config, implementation) pairs, open capture contexts]
_SWITCHED: dict[int, list[Any]] = {}
_SWITCH_LOCK = threading.Lock()


@contextmanager
def _switched(model: nn.Module, name: str) -> Iterator[None]:
    """Route ``model``'s attention through ``name`` while any capture of it is open.

    The first context saves every config's implementation and switches; the last one restores
    them. Contexts of different threads may overlap in any order (A enters, B enters, A exits,
    B exits): the model stays switched until B exits and is then exactly as it was.
    """
    with _SWITCH_LOCK:
        entry = _SWITCHED.get(id(model))
        if entry is None:
            saved = [(config, config._attn_implementation_internal) for config in _configs(model)]
            try:
                model.set_attn_implementation(name)
                if model.config._attn_implementation != name:
                    raise AttentionUnavailableError(
                        f"{type(model).__name__} does not route attention through "
                        "transformers' AttentionInterface; capture it with paths=[...] instead")
            except BaseException:
                for config, implementation in saved:
                    config._attn_implementation_internal = implementation
                raise
            entry = _SWITCHED[id(model)] = [saved, 0]
        entry[1] += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            entry[1] -= 1
            if entry[1] == 0:
                del _SWITCHED[id(model)]
                for config, implementation in entry[0]:
                    config._attn_implementation_internal = implementation


def _run_hooks(model: nn.Module, recorder: Recorder, sites: list[Site]) -> list[Any]:
    """Hooks that mark each run of an interface site's module (:mod:`attnprobe.capture.runs`)."""
    handles = []
    for site in sites:
        module = model.get_submodule(site.path)

        def start(module: nn.Module, args: tuple, base: Site = site) -> None:
            if recorder.is_open:
                recorder.start_run(module, base)
                recorder.ran.add(base)

        def end(module: nn.Module, args: tuple, output: Any) -> None:
            recorder.end_run(module)

        handles.append(module.register_forward_pre_hook(start))
        handles.append(module.register_forward_hook(end, always_call=True))
    return handles


@contextmanager
def hf_seam(model: nn.Module, recorder: Recorder) -> Iterator[list[Site]]:
    """Capture every attention site of ``model``: through the attnprobe attention function
    for modules that use transformers' attention interface, inside the module's forward for
    the others (:mod:`attnprobe.capture.module_seam`); yield the scoped sites. The function
    serves ``recorder`` while it is open (:meth:`Recorder.opened`)."""
    ways = site_ways(model)
    if not ways:
        raise AttentionUnavailableError(
            f"{type(model).__name__} has no attention weights to capture: none of its modules "
            "computes a softmax over keys (a state-space or linear-recurrence model?)")
    sites = list(ways)
    recorder.check_layers(layer_depths(model, sites))
    recorder.found_sites = True
    interface = [site for site, how in ways.items() if how == "interface"]
    if interface and not can_switch(model):
        interface = []
    own = [site for site in sites if site not in interface]
    with ExitStack() as stack:
        if interface:
            current = model.config._attn_implementation
            delegate = current[len(PREFIX):] if current.startswith(PREFIX) else current
            delegate = delegate if delegate in DELEGATES else "sdpa"
            recorder.site_of = _Sites(model, interface).site_of
            name = stack.enter_context(_registered(delegate))
            stack.enter_context(_switched(model, name))
            for handle in _run_hooks(model, recorder, interface):
                stack.callback(handle.remove)
        if own:
            stack.enter_context(module_seam(model, recorder, own))
        yield [s for s in sites if recorder.wants(s)]
