"""ModelInfo for any captured model: HF config, reference-model config, or plain module."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from attnprobe.capture import discovery, hf, hooks
from attnprobe.capture.sites import layer_counts
from attnprobe.core.scope import Scope, ScopeLike
from attnprobe.core.tokens import token_style
from attnprobe.core.version import __version__
from attnprobe.types import ModelInfo


def library_versions() -> dict[str, str]:
    """Versions of what produced a result (only libraries already imported)."""
    versions = {"attnprobe": __version__, "torch": torch.__version__.split("+")[0]}
    if "transformers" in sys.modules:
        versions["transformers"] = sys.modules["transformers"].__version__
    return versions


def _read(config: object, name: str) -> object:
    """``config.name``; on a heterogeneous transformers config (``per_layer_config``, e.g.
    dots3's sliding layers with their own head count) the global read of a per-layer
    attribute raises, so the largest value over the layers is returned: the widest layer
    bounds every head index a scope may name."""
    if getattr(config, "is_heterogeneous", False) is True:
        values = [getattr(layer, name, None) for layer in config.per_layer_config]
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        return max(ints, default=None)
    return getattr(config, name, None)


def _first(config: object, *names: str, default: int = 0) -> int:
    for name in names:
        value = _read(config, name)
        if isinstance(value, int):
            return value
    return default


def _dtype(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return str(param.dtype).removeprefix("torch.") if param is not None else "float32"


def model_info(model: nn.Module, *, implementation: str, n_layers: int = 0, n_heads: int = 0,
               causal: bool | None = None, dtype: str | None = None,
               tokenizer: Any = None) -> ModelInfo:
    """Describe ``model``; the config wins, the counts seen during capture fill in the rest.
    ``dtype``: what the attention weights were computed in, when known (under autocast it
    differs from the parameters' dtype, the default). ``tokenizer``: records how its tokens
    spell text (:func:`attnprobe.core.tokens.token_style`).

    Example:
        >>> info = model_info(model, implementation="sdpa")
        >>> info.arch, info.n_layers, info.n_heads, info.causal    # MiniLM: a BERT encoder
        ('bert', 6, 12, False)
        >>> model_info(lm, implementation="hook").causal
        True
    """
    config = getattr(model, "config", None)
    name = (getattr(model, "attnprobe_name", None) or getattr(config, "_name_or_path", None)
            or type(model).__name__)
    arch = getattr(config, "model_type", None) or type(model).__name__
    layers = _first(config, "num_hidden_layers", "num_layers", "n_layers", "n_layer",
                    default=n_layers)
    heads = _first(config, "num_attention_heads", "num_heads", "n_heads", "n_head",
                   default=n_heads)
    if causal is None:  # unknown when neither the attention modules nor the config say
        causal = discovery.declared_causal(model)
    return ModelInfo(name=str(name), arch=str(arch), n_layers=layers, n_heads=heads,
                     causal=causal, attn_implementation=implementation,
                     dtype=dtype or _dtype(model),
                     versions=library_versions(),
                     token_style=None if tokenizer is None else token_style(tokenizer))


def causal_of(model: nn.Module) -> bool | None:
    """Whether the model's self-attention is causal (for encoder-decoder models: the
    encoder's, which is not): the ``is_causal`` flag of a transformers model's attention
    modules, else a reference model's ``config.causal`` (or ``is_decoder``); ``None`` when
    nothing says."""
    config = getattr(model, "config", None)
    if hf.is_hf_model(model):
        if getattr(config, "is_encoder_decoder", False):
            return False
        flags = [getattr(model.get_submodule(site.path), "is_causal", None)
                 for site in discovery.hf_sites(model)
                 if site.kind == "self" and site.side == "main"]
        flags = [flag for flag in flags if isinstance(flag, bool)]
        if flags:
            return any(flags)
    return discovery.declared_causal(model)


def attention_sizes(model: nn.Module) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of a model's attention (0 when unknown).

    Layers are counted from the attention sites the capture seam will see (the longest stack;
    the depth for layers that share a module, :func:`~attnprobe.capture.discovery.
    layer_depths`), heads come from the config (``num_attention_heads``, ``n_heads`` ...), as
    in :func:`model_info`.

    Example:
        >>> attention_sizes(model), attention_sizes(lm)
        ((6, 12), (2, 4))
    """
    if hf.is_hf_model(model):
        sites = discovery.hf_sites(model)
        counts = discovery.layer_depths(model, sites)
    else:
        paths = hooks.hook_point_paths(model)
        counts = layer_counts(hooks.path_sites(model, paths) if paths else [])
    info = model_info(model, implementation="")
    n_layers = max(counts.values(), default=0) or info.n_layers
    return n_layers, info.n_heads


def model_scope(model: nn.Module, scope: ScopeLike) -> Scope:
    """``scope`` parsed and checked against the model's layers and heads (one-line error),
    kept to the layers that run attention (:meth:`Scope.within`: a hybrid's recurrent
    layers are left out of ``all`` and refused when named).

    Example:
        >>> model_scope(lm, "L1H3")
        Scope('head:1.3')
        >>> model_scope(lm, "layer:5")                  # lm has 2 layers
        Traceback (most recent call last):
        attnprobe.errors.InputError: ...

    On a hybrid (Jamba: layer 0 is a Mamba layer) ``"all"`` gives ``Scope('layer:1')``
    and ``"layer:0"`` is refused.
    """
    n_layers, n_heads = attention_sizes(model)
    name = type(model).__name__
    scope = Scope.parse(scope).validate(n_layers, n_heads, name=name)
    if not hf.is_hf_model(model):
        return scope
    layers = discovery.attention_layers(model, discovery.hf_sites(model))
    # a hybrid's recurrent layers run no attention: "all" means its attention layers
    return scope.within(layers, name=name) if len(layers) < n_layers else scope
