"""Wiring the AttnLRP rules (:mod:`attnprobe.attribution.lrp_rules`) into a transformers model
for the duration of a context, without a copy of the model's code.

Two seams, both undone when the context exits (also on an error):

- **attention**: the model is switched to ``attnprobe_lrp``, an attention function registered in
  transformers' AttentionInterface (with the eager mask function, which the name needs) that runs
  the attention as explicit matmuls — so an SDPA- or flash-loaded model works too — with the
  uniform rule on ``Q Kᵀ`` and ``A V``; the softmax is the model's own (its gradient *is* the
  AttnLRP softmax rule, see :func:`~attnprobe.attribution.lrp_rules.lrp_softmax`).
- **modules**: the ``forward`` of each module a :data:`MODULE_RULES` entry matches is replaced on
  the instance (the class is untouched) by the same computation through its rule: linear layers
  and GPT-2's ``Conv1D`` (ε-rule), layer norms and RMS norms (their spread held constant),
  elementwise activations (identity rule), and the LLaMA-layout gated MLP, whose two factors
  ``act(gate)`` and ``up`` each get half of the product's relevance (uniform rule).

Which modules a model may hold is checked before anything runs: :func:`check_lrp_model` refuses
a model type without a verified layout, an attention module that does not go through the
interface, and any leaf module no rule covers, each in one line naming it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.attribution.lrp_rules import (
    half_gradient,
    lrp_activation,
    lrp_layer_norm,
    lrp_linear,
    lrp_matmul,
    lrp_rms_norm,
)
from attnprobe.capture.discovery import site_ways
from attnprobe.core.optional import require
from attnprobe.core.registry import Registry
from attnprobe.errors import InputError

__all__ = ["ATTENTION_RULE", "FAMILIES", "IMPLEMENTATION", "MODULE_RULES", "ModuleRule",
           "check_lrp_model", "lrp_rules_installed", "rule_names"]

IMPLEMENTATION = "attnprobe_lrp"
"""The attention implementation name the model is switched to while the rules are installed."""

ATTENTION_RULE = "attention"
"""The rule name of the uniform rule on the attention's two matmuls."""

FAMILIES: dict[str, str] = {
    "bert": "BERT", "distilbert": "DistilBERT", "gpt2": "GPT-2",
    "llama": "LLaMA", "mistral": "Mistral", "qwen2": "Qwen2",
}
"""Model types whose every operation on the relevance path is a module a rule covers, a linear
operation (residual sums, scales, RoPE, the GQA repeat) or one whose plain gradient is its rule
(softmax; ReLU, which DistilBERT's classifier applies inline). RoBERTa is not among them: its
heads apply ``tanh`` and GELU inline, out of reach of a module rule."""

# leaves that carry no rule: lookups, no-ops in eval mode, and position tables
_PASSIVE = (nn.Embedding, nn.Dropout, nn.Identity)
_PASSIVE_SUFFIXES = ("RotaryEmbedding",)
_TORCH_ACTIVATIONS = (nn.GELU, nn.SiLU, nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Mish)

Swap = Callable[[nn.Module, Callable[..., Any]], None]


@dataclass(frozen=True)
class ModuleRule:
    """One rule applied to modules: which it matches, and how it replaces their forward.

    Attributes:
        summary: what it does, one phrase.
        matches: ``module -> bool``.
        install: ``(module, epsilon, swap)``: calls ``swap(target, new_forward)`` for each
            module whose forward it replaces (the module itself, or children of it).
        wraps: it wraps the target's current forward rather than replacing it, so it is
            installed after every rule that replaces (whatever order the rules are given in).
    """

    summary: str
    matches: Callable[[nn.Module], bool]
    install: Callable[[nn.Module, float, Swap], None]
    wraps: bool = False


MODULE_RULES: Registry[ModuleRule] = Registry("AttnLRP module rule")


def _is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _linear(module: nn.Module, epsilon: float, swap: Swap) -> None:
    if _is_conv1d(module):  # GPT-2's Conv1D keeps its weight as (in, out)
        swap(module, lambda x: lrp_linear(x, module.weight.t(), module.bias, epsilon))
    else:
        swap(module, lambda x: lrp_linear(x, module.weight, module.bias, epsilon))


MODULE_RULES.register("linear")(ModuleRule(
    "ε-rule (nn.Linear, GPT-2's Conv1D)",
    lambda m: isinstance(m, nn.Linear) or _is_conv1d(m), _linear))


def _layer_norm(module: nn.Module, epsilon: float, swap: Swap) -> None:
    swap(module, lambda x: lrp_layer_norm(x, module.normalized_shape, module.weight,
                                          module.bias, module.eps))


MODULE_RULES.register("layer_norm")(ModuleRule(
    "identity rule on the standard deviation (nn.LayerNorm)",
    lambda m: isinstance(m, nn.LayerNorm), _layer_norm))


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon") \
        and isinstance(getattr(module, "weight", None), torch.Tensor)


def _rms_norm(module: nn.Module, epsilon: float, swap: Swap) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        # as LLaMA's norm: normalised in at least float32, cast back, then scaled
        wide = torch.promote_types(x.dtype, torch.float32)
        normed = lrp_rms_norm(x.to(wide), None, module.variance_epsilon).to(x.dtype)
        return module.weight * normed
    swap(module, forward)


MODULE_RULES.register("rms_norm")(ModuleRule(
    "identity rule on the root mean square (LLaMA-style RMSNorm)", _is_rms_norm, _rms_norm))


def _is_activation(module: nn.Module) -> bool:
    return isinstance(module, _TORCH_ACTIVATIONS) \
        or type(module).__module__ == "transformers.activations"


def _activation(module: nn.Module, epsilon: float, swap: Swap) -> None:
    own = own_forward(module)
    swap(module, lambda x: lrp_activation(x, own, epsilon))


MODULE_RULES.register("activation")(ModuleRule(
    "identity rule (GELU, SiLU, tanh ...)", _is_activation, _activation))


_GATE_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


def _is_gated_mlp(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, part, None), nn.Module) for part in _GATE_PARTS)


def _gate(module: nn.Module, epsilon: float, swap: Swap) -> None:
    # down(act(gate(x)) * up(x)): each factor only feeds the product, so halving both
    # factors' gradients makes the product's gradient the uniform rule
    for part in (module.act_fn, module.up_proj):
        own = own_forward(part)
        swap(part, lambda *args, _own=own, **kwargs: half_gradient(_own(*args, **kwargs)))


MODULE_RULES.register("gate")(ModuleRule(
    "uniform rule on the gated MLP's product act(gate) ⊙ up", _is_gated_mlp, _gate, wraps=True))


def rule_names() -> tuple[str, ...]:
    """Every rule name: the module rules, then :data:`ATTENTION_RULE`."""
    return (*MODULE_RULES.names(), ATTENTION_RULE)


# ------------------------------------------------------------------------ the refusals
def _leaf_covered(module: nn.Module) -> bool:
    return isinstance(module, _PASSIVE) \
        or type(module).__name__.endswith(_PASSIVE_SUFFIXES) \
        or any(rule.matches(module) for rule in MODULE_RULES.values())


def check_lrp_model(model: nn.Module) -> None:
    """Refuse, in one line, a model the rules do not cover (before any forward).

    Raises:
        InputError: not a transformers model of :data:`FAMILIES`; an attention module that
            computes its weights itself; a leaf module (one without children) that no rule
            covers, named with its parent's class and its path.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        raise InputError(f"attn_lrp has no rules for {type(model).__name__} (model type "
                         f"{model_type!r}): its layers are mapped for "
                         f"{', '.join(sorted(FAMILIES))} only")
    own = [site.path for site, how in site_ways(model).items() if how != "interface"]
    if own:
        raise InputError(f"attn_lrp has no rule for {type(model.get_submodule(own[0])).__name__}"
                         f" at {own[0]}: it computes its attention itself, not through "
                         "transformers' attention interface")
    parents = {id(child): module for module in model.modules() for child in module.children()}
    for path, module in model.named_modules():
        if next(module.children(), None) is None and not _leaf_covered(module):
            parent = parents.get(id(module), model)
            raise InputError(f"attn_lrp has no rule for {type(parent).__name__}'s "
                             f"{type(module).__name__} at {path}")


# ------------------------------------------------------------------------ the attention seam
_MATMUL: contextvars.ContextVar[Callable[..., torch.Tensor]] = contextvars.ContextVar(
    "attnprobe_lrp_matmul", default=torch.matmul)


def lrp_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: torch.Tensor | None,
                  scaling: float | None = None, dropout: float = 0.0, **kwargs: Any
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with the matmuls of the open context (uniform rule, or plain).

    Args:
        query: ``[batch, heads, query, head_dim]``; key, value: ``[batch, kv_heads, key,
            head_dim]`` (grouped-query heads are repeated, a linear copy).
        attention_mask: additive float ``[batch, 1, query, key]`` (or bool, True = seen) or None.

    Returns:
        ``([batch, query, heads, head_dim], weights [batch, heads, query, key])``.
    """
    matmul = _MATMUL.get()
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = matmul(query, key.transpose(-2, -1)) * scale
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask[..., :key.shape[-2]]
    # softmax in at least float32 (as the models' eager code), without rounding float64 down
    wide = torch.promote_types(scores.dtype, torch.float32)
    weights = torch.softmax(scores.to(wide), dim=-1).to(value.dtype)
    out = matmul(weights, value)
    return out.transpose(1, 2).contiguous(), weights


_REGISTERED = [0]  # open contexts using the registration
_LOCK = threading.Lock()


@contextmanager
def _registered() -> Iterator[None]:
    transformers = require("transformers")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    with _LOCK:
        if not _REGISTERED[0]:
            transformers.AttentionInterface.register(IMPLEMENTATION, lrp_attention)
            AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
        _REGISTERED[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _REGISTERED[0] -= 1
            if not _REGISTERED[0]:  # no public unregister: the class-wide mapping register fills
                transformers.AttentionInterface._global_mapping.pop(IMPLEMENTATION, None)
                AttentionMaskInterface._global_mapping.pop(IMPLEMENTATION, None)


def _configs(model: nn.Module) -> list[Any]:
    """Every config of the model and its sub-models (``set_attn_implementation`` may change
    any)."""
    found = {id(c): c for m in model.modules() if hasattr(c := getattr(m, "config", None),
                                                          "_attn_implementation_internal")}
    return list(found.values())


@contextmanager
def _switched(model: nn.Module) -> Iterator[None]:
    saved = [(config, config._attn_implementation_internal) for config in _configs(model)]
    try:
        model.set_attn_implementation(IMPLEMENTATION)
        if model.config._attn_implementation != IMPLEMENTATION:
            raise InputError(f"attn_lrp could not switch {type(model).__name__}'s attention to "
                             "explicit matmuls (transformers refused the implementation)")
        yield
    finally:
        for config, implementation in saved:
            config._attn_implementation_internal = implementation


def _seat(module: nn.Module) -> str:
    """The attribute holding the forward a rule replaces: ``_old_forward`` under an
    accelerate hook, which calls it between loading the module's offloaded weights and
    putting them back (replacing ``forward`` would skip the hook and meet ``meta``
    weights); ``forward`` otherwise."""
    hooked = "_hf_hook" in module.__dict__ and "_old_forward" in module.__dict__
    return "_old_forward" if hooked else "forward"


def own_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward a wrapping rule wraps (inside any accelerate hook: :func:`_seat`)."""
    return getattr(module, _seat(module))


@contextmanager
def _swapped_forwards(model: nn.Module, rules: tuple[str, ...], epsilon: float
                      ) -> Iterator[int]:
    """Replace the forward of every module a rule in ``rules`` matches; yield how many."""
    saved: list[tuple[nn.Module, str, Any]] = []
    missing = object()

    def swap(module: nn.Module, forward: Callable[..., Any]) -> None:
        seat = _seat(module)
        saved.append((module, seat, module.__dict__.get(seat, missing)))
        setattr(module, seat, forward)

    try:
        chosen = [MODULE_RULES.get(name) for name in rules if name != ATTENTION_RULE]
        for rule in sorted(chosen, key=lambda r: r.wraps):
            for module in list(model.modules()):
                if rule.matches(module):
                    rule.install(module, epsilon, swap)
        yield len(saved)
    finally:
        for module, seat, forward in reversed(saved):  # later swaps wrapped earlier ones
            if forward is missing:
                module.__dict__.pop(seat, None)
            else:
                setattr(module, seat, forward)


@contextmanager
def lrp_rules_installed(model: nn.Module, rules: tuple[str, ...], epsilon: float
                        ) -> Iterator[None]:
    """The model computes as before, with the AttnLRP backward of ``rules`` (names of
    :func:`rule_names`), while the context is open; everything is restored on exit.

    The attention always runs as explicit matmuls (``attnprobe_lrp``); with
    :data:`ATTENTION_RULE` not in ``rules`` they are plain ``torch.matmul``.
    """
    token = _MATMUL.set(lrp_matmul if ATTENTION_RULE in rules else torch.matmul)
    try:
        with ExitStack() as stack:
            stack.enter_context(_registered())
            stack.enter_context(_switched(model))
            stack.enter_context(_swapped_forwards(model, rules, epsilon))
            yield
    finally:
        _MATMUL.reset(token)
