"""The HuggingFace seam: an attention function in transformers' AttentionInterface.

For the duration of a context the model is switched to ``attnprobe_<backend>``, an attention
function registered together with its mask function (without the mask function transformers
silently drops the causal mask for unknown implementation names): the function of
:mod:`attnprobe.capture.attend`, which runs the original backend for layers not asked for and
the model's own eager function, with the capture's parts, for the others. Attention modules
that compute their weights themselves are read by :mod:`attnprobe.capture.module_seam`.

Per-capture state lives in the recorders open in the calling thread (a ContextVar), never on
the model. The implementation switch is reference-counted per model and the registration per
name, so overlapping captures (nested, or in several threads, in any order) restore the model
and remove the registration when the last of them exits — also on an error or Ctrl-C.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

from torch import nn

from attnprobe.capture.attend import attnprobe_attention
from attnprobe.capture.discovery import attention_layers, can_switch, layer_depths, site_ways
from attnprobe.capture.module_seam import module_seam
from attnprobe.capture.recorder import Recorder
from attnprobe.capture.sites import Site
from attnprobe.core.optional import require
from attnprobe.errors import AttentionUnavailableError

PREFIX = "attnprobe_"
DELEGATES = ("sdpa", "eager")  # original backends we can hand unrequested layers to


class _Sites:
    """Which module of one captured model is which attention site (by module identity)."""

    def __init__(self, model: nn.Module, sites: list[Site]) -> None:
        self.sites = {id(model.get_submodule(site.path)): site for site in sites}

    def site_of(self, module: nn.Module) -> Site | None:
        return self.sites.get(id(module))


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
    # raises when the scope names a layer without attention (a hybrid's Mamba layer), which
    # would otherwise record nothing and say nothing
    recorder.scope.within(attention_layers(model, sites), name=type(model).__name__)
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
        if own:
            stack.enter_context(module_seam(model, recorder, own))
        yield [s for s in sites if recorder.wants(s)]
