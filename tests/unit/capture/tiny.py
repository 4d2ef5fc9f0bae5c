"""Batches and independent references for the capture unit tests.

The models are the tiny random families of ``tests/integration/hf_models.py`` (hidden 32,
2 layers, 4 heads) and the reference transformer. Expected weights always come from
transformers' own eager path (the twin's ``output_attentions=True``) or from plain forward
hooks, never from attnprobe.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.integration.hf_models import FAMILIES, FIRST_REAL_ID, VOCAB


def batch(name: str, lengths: tuple[int, ...] = (7, 5), seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` / ``attention_mask`` ``[batch, max(lengths)]`` for family
    ``name`` (real tokens never collide with the special ids)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), FAMILIES[name].pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(FIRST_REAL_ID, VOCAB, (n,), generator=g)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def eager_attentions(twin: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The eager twin's weights ``[batch, layer, head, query, key]``, padding included."""
    with torch.no_grad():
        out = twin(**inputs, output_attentions=True)
    return torch.stack(out.attentions, dim=1)


def eager_maps(twin: nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Per example, the eager twin's weights ``[layer, head, query, key]``, real tokens only."""
    weights = eager_attentions(twin, inputs)
    mask = inputs["attention_mask"].bool()
    return [weights[b][:, :, mask[b]][..., mask[b]] for b in range(len(mask))]


def hidden(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``last_hidden_state`` of a plain forward (no gradient)."""
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def registrations() -> set[str]:
    """attnprobe's names in transformers' attention and mask registries."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    names = {*AttentionInterface._global_mapping, *AttentionMaskInterface._global_mapping}
    return {name for name in names if name.startswith("attnprobe_")}
