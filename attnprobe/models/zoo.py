"""The registry of reference models: name -> builder ``(seed=0) -> (model, tokenizer)``.

Every builder seeds its own RNG (the global torch RNG is left untouched), sets
``model.attnprobe_name`` and returns the model in eval mode, through :func:`seeded_reference`.
Other mechanism families register their builders here with
``@REFERENCE_MODELS.register("name")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import ModelNotFoundError
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.transformer import TransformerModel

Builder = Callable[..., tuple[nn.Module, WordTokenizer]]
REFERENCE_MODELS: Registry[Builder] = Registry("reference model")


def build_reference(name: str, seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """Build the reference model registered as ``name``; raise ModelNotFoundError if unknown.

    Example:
        >>> ref, ref_tok = build_reference("mha")       # one bidirectional layer of 4 heads
        >>> ref.attnprobe_name, ref.training
        ('mha', False)
        >>> again, _ = build_reference("mha")           # seeded: the same weights every time
        >>> all(torch.equal(a, b) for a, b in zip(ref.parameters(), again.parameters()))
        True
    """
    if name not in REFERENCE_MODELS:
        raise ModelNotFoundError(one_of("reference model", name, REFERENCE_MODELS.names()))
    return REFERENCE_MODELS.get(name)(seed=seed)


def finish_reference(model: nn.Module, name: str) -> nn.Module:
    """Name a freshly built reference model (``model.attnprobe_name``) and put it in eval
    mode; every builder ends with it."""
    model.attnprobe_name = name
    return model.eval()


def seeded_reference(
    name: str, seed: int, tokenizer: WordTokenizer, make: Callable[[], nn.Module]
) -> tuple[nn.Module, WordTokenizer]:
    """``make()`` under ``torch.manual_seed(seed)`` (the global torch RNG is restored after),
    finished by :func:`finish_reference`, with its tokenizer: the body of every builder."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make()
    return finish_reference(model, name), tokenizer


def _transformer(
    name: str, seed: int, *, causal: bool, **config: Any
) -> tuple[nn.Module, WordTokenizer]:
    tokenizer = WordTokenizer()
    make = TransformerModel.decoder_only if causal else TransformerModel.encoder
    return seeded_reference(name, seed, tokenizer, lambda: make(
        len(tokenizer), max_len=tokenizer.model_max_length, **config))


@REFERENCE_MODELS.register("sdpa")
def sdpa(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """One layer of single-head scaled dot-product attention over learned embeddings."""
    return _transformer("sdpa", seed, causal=False, n_layers=1, n_heads=1)


@REFERENCE_MODELS.register("mha")
def mha(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """One bidirectional layer of 4-head attention."""
    return _transformer("mha", seed, causal=False, n_layers=1, n_heads=4)


@REFERENCE_MODELS.register("encoder")
def encoder(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer, 4-head bidirectional encoder."""
    return _transformer("encoder", seed, causal=False, n_layers=2, n_heads=4)


@REFERENCE_MODELS.register("transformer")
def transformer(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """A 2-layer causal decoder-only model, 4 query heads sharing 2 key/value heads (GQA)."""
    return _transformer("transformer", seed, causal=True, n_layers=2, n_heads=4, n_kv_heads=2)
