"""AttnLRP (Achtibat et al. 2024, ICML) as an attribution method: ``attn_lrp``.

One forward with the rules of :mod:`attnprobe.attribution.lrp_rules` installed
(:func:`~attnprobe.attribution.attn_lrp_patch.lrp_rules_installed`: LRP-ε through the linear
layers, the uniform rule through ``Q Kᵀ``, ``A V`` and the gated MLP's product, the identity rule
through the norms and activations, the softmax's own gradient as its rule) and one backward from
the explained target value with gradient 1. Token ``i`` scores ``R_i = Σ_d e_id · g_id``, ``e`` the
output of the input (word) embedding layer and ``g`` the modified gradient reaching it — the
relevance LXT reads (``inputs_embeds * inputs_embeds.grad``, summed over the embedding).

The conservation gap ``Σ_i R_i − f(x)`` (absolute, signed, in the target's units) is the
method's ``delta``: the ε-rule and the linear steps lose only ``ε`` and the biases' share, the
softmax rule's bias term absorbs more (LXT keeps about 72 % of the logit of a tiny random LLaMA).
For BERT-family and GPT-2 models the gap also holds the relevance of the *position* (and token
type) embeddings, which the model adds to the word embeddings and which belongs to no token's
word vector; LLaMA-layout models (rotary positions) have no such term.

Supported: :data:`~attnprobe.attribution.attn_lrp_patch.FAMILIES` (BERT, DistilBERT, GPT-2,
LLaMA, Mistral, Qwen2), eager-, SDPA- or flash-loaded (the attention runs as explicit matmuls
while the rules are installed). Anything else is refused before a forward, naming what has no
rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from attnprobe.attribution.attn_lrp_patch import check_lrp_model, lrp_rules_installed, rule_names
from attnprobe.attribution.lrp_rules import DEFAULT_EPSILON
from attnprobe.attribution.method_base import METHODS, Explanation, Problem
from attnprobe.errors import HookNotFiredError, InputError

__all__ = ["AttnLRP"]


@METHODS.register("attn_lrp")
@dataclass(frozen=True)
class AttnLRP:
    """AttnLRP relevance of each input token for the target, with its conservation gap.

    Args:
        epsilon: ε of the linear layers' ε-rule and of the identity rule's division (≥ 0).
        rules: the rules installed (names of
            :func:`~attnprobe.attribution.attn_lrp_patch.rule_names`; default all). Without
            any, the backward is the plain gradient and the scores are input × gradient.
    """

    name: ClassVar[str] = "attn_lrp"
    summary: ClassVar[str] = ("AttnLRP (Achtibat et al. 2024): LRP-ε, uniform and identity "
                              "rules through attention, norms and the gated MLP; delta = the "
                              "conservation gap")
    knob: ClassVar[str | None] = None
    epsilon: float = DEFAULT_EPSILON
    rules: tuple[str, ...] = rule_names()

    def __post_init__(self) -> None:
        if not self.epsilon >= 0:
            raise InputError(f"attn_lrp epsilon must be a non-negative number, got "
                             f"{self.epsilon!r}")
        unknown = [r for r in self.rules if r not in rule_names()]
        if unknown or isinstance(self.rules, str):
            raise InputError(f"attn_lrp rules must be a tuple of {', '.join(rule_names())}; "
                             f"got {self.rules!r}")

    def cost(self, n_tokens: int) -> int:
        return n_tokens  # one forward and its backward

    def check(self, model: nn.Module) -> None:
        """Refuse, before any forward, a model the rules do not cover or that is not ready."""
        if torch.is_inference_mode_enabled():
            raise InputError("attn_lrp needs gradients: call it outside torch.inference_mode()")
        if any(m.training for m in model.modules()):
            raise InputError("dropout makes attributions random: call model.eval()")
        check_lrp_model(model)

    def explain(self, problem: Problem) -> Explanation:
        """Relevance ``[seq]`` of each token and the gap ``Σ R − f(x)`` as ``delta``."""
        self.check(problem.model)
        seen: list[torch.Tensor] = []

        def leaf(_module: nn.Module, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
            # a fresh leaf: the backward stops here and no parameter gathers a .grad
            embeds = out.detach().requires_grad_(True)
            seen.append(embeds)
            return embeds

        handle = problem.layer().register_forward_hook(leaf)
        try:
            with torch.enable_grad(), lrp_rules_installed(problem.model, self.rules,
                                                          self.epsilon):
                value = problem.forward(problem.ids, problem.inputs["attention_mask"])[0]
                if not seen:
                    raise HookNotFiredError(f"embedding layer {type(problem.layer()).__name__}"
                                            " was not called by the forward: pass embedding=")
                (grad,) = torch.autograd.grad(value, seen[0], allow_unused=True)
        finally:
            handle.remove()
        if grad is None:
            raise InputError("the target does not depend on the input embeddings: nothing to "
                             "explain")
        scores = (seen[0].detach() * grad).sum(-1)[0]  # [seq]
        return Explanation(scores, float(scores.sum()) - float(value.detach()))
