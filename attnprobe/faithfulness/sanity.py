"""The model-randomisation check (Adebayo et al. 2018): an explanation that depends on what
the model learned must change when the top layers' weights are re-initialised. Each
source's importance is computed again on a randomised copy of the model, and the Spearman
correlation of the two rankings over the real tokens is recorded; a source whose mean
correlation stays high is flagged in :meth:`~attnprobe.faithfulness.result.Faithfulness.
summary`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from attnprobe.attribution.metrics import spearman
from attnprobe.capture import discovery, hf
from attnprobe.core.display import counted
from attnprobe.core.residence import is_offloaded, quantized_modules
from attnprobe.errors import InputError
from attnprobe.types import TokenAttribution
from attnprobe.weights.anatomy import anatomy

__all__ = ["check_copyable", "randomized_copy", "sanity_rows", "top_blocks"]


def top_blocks(model: nn.Module, n: int | None) -> list[nn.Module]:
    """The modules of the last ``n`` blocks of the model's self-attention stack (default: the
    top half), top first: a transformers model's blocks, or the attention, output
    projection, norm and MLP of each layer of a model whose weights attnprobe reads
    (:func:`~attnprobe.weights.anatomy.anatomy`: the reference models)."""
    if hf.is_hf_model(model):
        sites = [s for s in discovery.hf_sites(model) if s.kind == "self"]
        if not sites:
            raise InputError(f"{type(model).__name__} has no self-attention stack to randomise")
        stack = sites[0].stack
        layers = sorted({s.layer for s in sites if s.stack == stack})
        blocks = [model.get_submodule(f"{stack}.{layer}") for layer in layers]
    else:
        parts = anatomy(model).layers  # refuses a model of no known family in one line
        blocks = [nn.ModuleList([m for m in (p.attn, p.out_proj, p.norm, p.mlp)
                                 if m is not None]) for p in parts]
    count = max(1, len(blocks) // 2) if n is None else n
    if count > len(blocks):
        raise InputError(f"randomize={count} but the model has {counted(len(blocks), 'layer')}")
    return blocks[::-1][:count]


def _reinitialise(model: nn.Module, module: nn.Module) -> None:
    """The model's own initialiser (transformers), else each layer's ``reset_parameters``."""
    init = getattr(model, "_init_weights", None)
    if hf.is_hf_model(model) and callable(init):
        init(module)
    elif callable(reset := getattr(module, "reset_parameters", None)):
        reset()


def check_copyable(model: nn.Module) -> None:
    """Refuse, in one line naming the fix, a model whose copy cannot be re-initialised:
    an offloaded one (its weights wait on ``meta`` and the copy's offload hooks would load
    the *original* weights back over the redrawn ones, after copying accelerate's weight
    maps, the whole offloaded model) or a quantized one (its integer weights cannot take the
    initialiser's floating values)."""
    offloaded = [name for name, module in model.named_modules() if is_offloaded(module)]
    if offloaded:
        raise InputError(f"the sanity check re-initialises a copy of the model, and {offloaded[0]}"
                         " is offloaded (device map with CPU/disk offload): load the model "
                         "without --device-map/--offload-folder, or leave sanity off")
    quantized = quantized_modules(model)
    if quantized:
        raise InputError(f"the sanity check re-initialises a copy of the model's weights, and "
                         f"{quantized[0]} holds quantized weights: load the model without "
                         "--quantization, or leave sanity off")


def randomized_copy(model: nn.Module, n: int | None, *, seed: int = 0) -> nn.Module:
    """A copy of ``model`` with its top ``n`` blocks re-initialised (seeded), in eval mode;
    ``model`` is untouched.

    Example:
        >>> shuffled = randomized_copy(model, 2)                # MiniLM: layers 4 and 5 redrawn
        >>> top = shuffled.encoder.layer[5].attention.self.query.weight
        >>> bool((top != model.encoder.layer[5].attention.self.query.weight).any())
        True
    """
    check_copyable(model)
    top_blocks(model, n)  # refused before the copy
    clone = copy.deepcopy(model).eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for block in top_blocks(clone, n):
            for module in block.modules():
                _reinitialise(clone, module)
    return clone


def sanity_rows(example: str, found: Sequence[TokenAttribution],
                again: Sequence[TokenAttribution], special: np.ndarray,
                methods: Sequence[str]) -> list[tuple]:
    """``SANITY_COLUMNS`` rows of one text: per source, Spearman's ρ of its importance on
    the model (``found``) and on the randomised copy (``again``) over the real tokens (NaN
    when either is constant there)."""
    rows = []
    real = ~special
    for first, second in zip(found, again, strict=True):
        a, b = first.scores.numpy()[real], second.scores.numpy()[real]
        if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
            rho = math.nan
        else:
            rho = float(spearman(a, b, names=("model", "randomised model"))[0])
        kind = "attribution" if first.method in methods else "attention"
        rows.append((example, first.method, kind, rho))
    return rows
