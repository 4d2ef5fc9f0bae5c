"""gradients_reach: activations of a frozen model reach autograd, also under no_grad, and the
model is frozen again afterwards, also when the body raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnprobe.core.autograd import gradients_reach


def frozen_pair() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)  # one frozen, the rest trainable
    model[0].requires_grad_(False)
    return model


def test_an_activation_of_a_frozen_model_gets_its_gradient_under_no_grad():
    model = frozen_pair()
    x = torch.randn(4, 3)
    with torch.no_grad(), gradients_reach(model):
        hidden = model[0](x)
        out = model[1](hidden).sum()
        (grad,) = torch.autograd.grad(out, hidden)
    # d(sum of w·h + b)/dh is w in every row, by construction
    torch.testing.assert_close(grad, model[1].weight.detach().expand(4, 2))
    assert all(p.grad is None for p in model.parameters())


def test_the_frozen_parameters_are_frozen_again_also_on_error():
    model = frozen_pair()
    before = [p.requires_grad for p in model.parameters()]
    assert before == [False, False, False, True]
    with pytest.raises(RuntimeError, match="boom"), gradients_reach(model):
        assert all(p.requires_grad for p in model.parameters())
        raise RuntimeError("boom")
    assert [p.requires_grad for p in model.parameters()] == before
    with torch.no_grad():
        with gradients_reach(model):
            assert torch.is_grad_enabled()
        assert not torch.is_grad_enabled()  # the caller's grad mode again
