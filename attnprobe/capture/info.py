"""ModelInfo for any captured model: HF config, reference-model config, or plain module."""

from __future__ import annotations

import sys

import torch
from torch import nn

from attnprobe.types import ModelInfo


def library_versions() -> dict[str, str]:
    """Versions of what produced a result (only libraries already imported)."""
    from attnprobe import __version__

    versions = {"attnprobe": __version__, "torch": torch.__version__.split("+")[0]}
    if "transformers" in sys.modules:
        versions["transformers"] = sys.modules["transformers"].__version__
    return versions


def _first(config: object, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return default


def _dtype(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return str(param.dtype).removeprefix("torch.") if param is not None else "float32"


def model_info(model: nn.Module, *, implementation: str, n_layers: int = 0, n_heads: int = 0,
               causal: bool | None = None) -> ModelInfo:
    """Describe ``model``; the config wins, the counts seen during capture fill in the rest."""
    config = getattr(model, "config", None)
    name = (getattr(model, "attnprobe_name", None) or getattr(config, "_name_or_path", None)
            or type(model).__name__)
    arch = getattr(config, "model_type", None) or type(model).__name__
    layers = _first(config, "num_hidden_layers", "num_layers", "n_layers", "n_layer",
                    default=n_layers)
    heads = _first(config, "num_attention_heads", "num_heads", "n_heads", "n_head",
                   default=n_heads)
    if causal is None:  # unknown when neither the attention modules nor the config say
        flag = getattr(config, "causal", getattr(config, "is_decoder", None))
        causal = flag if isinstance(flag, bool) else None
    return ModelInfo(name=str(name), arch=str(arch), n_layers=layers, n_heads=heads,
                     causal=causal, attn_implementation=implementation, dtype=_dtype(model),
                     versions=library_versions())
