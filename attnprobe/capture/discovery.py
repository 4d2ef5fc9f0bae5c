"""Which modules of a transformers model attend over tokens, and how a capture reaches each.

Two ways in (:data:`HOWS`):

- ``"interface"``: the module calls transformers' attention interface
  (``ALL_ATTENTION_FUNCTIONS``), so the capture's registered attention function runs for it
  (:mod:`attnprobe.capture.hf`);
- ``"module"``: the module computes its weights itself (GPT-Neo, Bloom, DeBERTa, MPNet ...):
  the capture reads them inside the module's forward (:mod:`attnprobe.capture.module_seam`).

A module is an attention site when its class (or a base class from the same library) calls
the interface or computes a softmax / SDPA itself, and its class name says attention (or
transformers records its outputs as attentions: LongCat's ``MLA``). When
the model declares which module classes produce its ``attentions`` outputs (transformers'
``_can_record_outputs``), only modules inside those count: that excludes modules that call the
interface for something else than attention over tokens (attention over depth, as in
Inkling's "AttentionResidual"), and linear-attention layers of hybrids, which compute no
softmax, are never candidates. Only the innermost candidate of a nest counts.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Literal

from torch import nn

from attnprobe.capture.sites import Site, layer_counts, site_for_path

__all__ = ["HOWS", "How", "attention_layers", "attention_sites", "calls_interface", "can_switch",
           "computes_weights", "declared_causal", "hf_sites", "layer_depths", "seams_of",
           "site_ways"]

How = Literal["interface", "module"]
HOWS: tuple[How, ...] = ("interface", "module")
_INTERFACE_MARKS = ("ALL_ATTENTION_FUNCTIONS", "attention_interface")
_OWN_MARKS = ("softmax", "scaled_dot_product_attention")
_NAMES = ("attention", "attn")
_OUTPUT_KEYS = ("attentions", "cross_attentions", "encoder_attentions", "decoder_attentions")


@cache
def _source(cls: type) -> str:
    """Source of ``cls`` and its bases outside torch (empty where there is none)."""
    parts = []
    for base in cls.__mro__:
        if base.__module__.startswith(("torch", "builtins")):
            continue
        try:
            parts.append(inspect.getsource(base))
        except (OSError, TypeError):  # built in a notebook or from C: nothing to read
            continue
    return "\n".join(parts)


def calls_interface(cls: type) -> bool:
    """Whether ``cls`` (or a base) routes attention through transformers' interface."""
    source = _source(cls)
    return any(mark in source for mark in _INTERFACE_MARKS)


def computes_weights(cls: type) -> bool:
    """Whether ``cls`` (or a base) computes attention weights itself (a softmax — also
    ``nn.Softmax`` — or SDPA)."""
    source = _source(cls).lower()
    return any(mark in source for mark in _OWN_MARKS)


def _recorded_classes(model: nn.Module) -> tuple[type, ...]:
    """Classes whose outputs transformers records as attention weights, over every
    pretrained sub-model (``_can_record_outputs``); empty when none declares them."""
    found: list[type] = []
    for module in model.modules():
        table = getattr(type(module), "_can_record_outputs", None)
        if not isinstance(table, dict):
            continue
        for key, entry in table.items():
            if key not in _OUTPUT_KEYS:
                continue
            for item in entry if isinstance(entry, (list, tuple)) else [entry]:
                target = getattr(item, "target_class", item)
                targets = target if isinstance(target, tuple) else (target,)
                found.extend(t for t in targets if isinstance(t, type))
    return tuple(dict.fromkeys(found))


def attention_sites(model: nn.Module) -> dict[str, tuple[nn.Module, How]]:
    """``path -> (module, how)`` for every attention site of ``model`` (module docstring),
    in module order."""
    recorded = _recorded_classes(model)
    candidates: dict[str, tuple[nn.Module, How]] = {}
    for path, module in model.named_modules():
        cls = type(module)
        if not any(name in cls.__name__.lower() for name in _NAMES) and cls not in recorded:
            continue
        if calls_interface(cls):
            candidates[path] = (module, "interface")
        elif computes_weights(cls):
            candidates[path] = (module, "module")
    if recorded:
        roots = [path for path, module in model.named_modules() if isinstance(module, recorded)]
        candidates = {path: found for path, found in candidates.items()
                      if any(path == root or path.startswith(root + ".") for root in roots)}
    return {path: found for path, found in candidates.items()
            if not any(other.startswith(path + ".") for other in candidates)}


def hf_sites(model: nn.Module) -> list[Site]:
    """Every attention site of a transformers model (:mod:`attnprobe.capture.discovery`)."""
    return list(site_ways(model))


def site_ways(model: nn.Module) -> dict[Site, How]:
    """Every attention site of a transformers model and how the capture reaches it."""
    encdec = bool(getattr(model.config, "is_encoder_decoder", False))
    return {site_for_path(path, module, encoder_decoder=encdec, root=model): how
            for path, (module, how) in attention_sites(model).items()}


def seams_of(model: nn.Module) -> tuple[str, ...]:
    """The seams a capture of ``model`` goes through: ``"hf"`` (the attention interface),
    ``"modules"`` (modules that compute their weights themselves), or both."""
    ways = set(site_ways(model).values())
    if "interface" in ways and not can_switch(model):
        ways = {"module"}
    return tuple(name for how, name in (("interface", "hf"), ("module", "modules"))
                 if how in ways) or ("hf",)


def can_switch(model: nn.Module) -> bool:
    """Whether transformers lets the model's attention implementation be switched (it
    does for classes that route attention through the interface)."""
    check = getattr(type(model), "_can_set_attn_implementation", None)
    return bool(check()) if callable(check) else False


def layer_depths(model: nn.Module, sites: list[Site]) -> dict[tuple[str, str], int]:
    """Layers of each (stack, kind) a forward can run: as many as the sites' indices say, or
    the config's ``num_hidden_layers`` for the stack of a model whose layers share attention
    modules (ALBERT: one module, ``num_hidden_layers`` runs)."""
    counts = layer_counts(sites)
    depth = getattr(model.config, "num_hidden_layers", None)
    if getattr(model.config, "is_encoder_decoder", False) or not isinstance(depth, int):
        return counts
    for key, count in counts.items():
        modules = sum(1 for site in sites if (site.stack, site.kind) == key)
        if key[1] == "self" and modules < depth and count < depth:
            counts[key] = depth
    return counts


def attention_layers(model: nn.Module, sites: list[Site]) -> tuple[int, ...]:
    """The model layers (in any stack) that run attention: every depth of a stack whose
    modules run several times (:func:`layer_depths`), else its sites' layers. A hybrid's
    recurrent layers (Jamba's Mamba layers) have no site and are left out: ``(1,)`` for a
    2-layer Jamba whose layer 0 is a Mamba layer.

    Example:
        >>> attention_layers(model, hf_sites(model))    # MiniLM: every layer attends
        (0, 1, 2, 3, 4, 5)
    """
    found: set[int] = set()
    for key, depth in layer_depths(model, sites).items():
        own = {site.layer for site in sites if (site.stack, site.kind) == key}
        found |= set(range(depth)) if depth > max(own) + 1 else own
    return tuple(sorted(found))


def declared_causal(model: nn.Module) -> bool | None:
    """What the model's config says of its self-attention: ``config.causal`` (attnprobe's
    reference models), else ``config.is_decoder``; ``None`` when it says neither."""
    config = getattr(model, "config", None)
    flag = getattr(config, "causal", getattr(config, "is_decoder", None))
    return flag if isinstance(flag, bool) else None
