"""A model whose output is a known function of its tokens, for the faithfulness tests.

``BagOfWords``: logit of class 1 = ``Σ_j w[id_j] · mask_j`` over the tokens the model sees,
class 0's logit = 0; so ``p(class 1) = sigmoid(Σ w)``. Removing token ``j`` (delete, or mask
out of attention) subtracts ``w[id_j]``; replacing it by a filler adds ``w[fill] − w[id_j]``.
"""

from __future__ import annotations

import torch

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_WORD = 5
VOCAB = 16


class BagOfWords(torch.nn.Module):
    """``forward(input_ids [B, L], attention_mask [B, L]) -> logits [B, 2]``."""

    def __init__(self, weights: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(weights.clone())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        total = (self.w[input_ids] * attention_mask.to(self.w.dtype)).sum(-1)
        return torch.stack([torch.zeros_like(total), total], dim=-1)


def weights(seed: int = 0) -> torch.Tensor:
    """``[VOCAB]`` float32: N(0, 1) at the words, 0.25 at [CLS] and [SEP], 0 at pad/unk/mask
    (so the fillers weigh nothing and every removal procedure gives the same output)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(VOCAB, generator=gen)
    w[[PAD, UNK, MASK]] = 0.0
    w[[CLS, SEP]] = 0.25
    return w


def text(n_real: int, seed: int = 1) -> torch.Tensor:
    """``[n_real + 2]`` ids: [CLS], ``n_real`` random words, [SEP]."""
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(FIRST_WORD, VOCAB, (n_real,), generator=gen)
    return torch.cat([torch.tensor([CLS]), words, torch.tensor([SEP])])


def special_of(ids: torch.Tensor) -> torch.Tensor:
    """``[seq]`` bools: True at [CLS] and [SEP]."""
    return (ids == CLS) | (ids == SEP)
