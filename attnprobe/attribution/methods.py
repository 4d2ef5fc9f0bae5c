"""Gradient and perturbation attributions of a target to the input tokens.

Every method scores each input token of one text for one :class:`~attnprobe.attribution.
targets.Target` and returns a :class:`~attnprobe.types.TokenAttribution`. The gradient
methods work on the output of the input embedding layer (``model.get_input_embeddings()``
for HF models, else the first ``nn.Embedding``; ``embedding=`` overrides), through hooks on
that layer, so they also work for models without ``inputs_embeds``. Score per token:

=========================  ===============================================================
method                     score of token ``i`` (``e_i``: its embedding, ``f``: the target)
=========================  ===============================================================
``integrated_gradients``   ``Σ_d`` of Captum's ``LayerIntegratedGradients``: ``(e_i − b_i) ·
                           mean over the path of ∂f/∂e_i``; baseline ``b``: the pad token at
                           every non-special position (special tokens kept), so special
                           tokens score 0 and the scores sum to ``f(x) − f(b)`` up to
                           ``delta`` (stored in ``TokenAttribution.delta``)
``saliency``               ``‖∂f/∂e_i‖₂`` over the embedding dimension (non-negative)
``input_x_gradient``       ``Σ_d e_i · ∂f/∂e_i`` (Jain & Wallace's gradient importance, signed)
``gradient_shap``          Captum ``GradientShap`` on the embeddings: expected gradient ×
                           (input − baseline), baselines drawn from {pad embedding, zeros}
                           (special tokens kept in both), ``n_samples`` draws, seeded
``leave_one_out``          ``f(x) − f(x without token i)``; special tokens are never deleted
                           (score 0)
``occlusion``              ``f(x) − f(x with token i replaced by [UNK])`` (the pad token when
                           the tokenizer has no unk); special tokens are never replaced
                           (score 0)
=========================  ===============================================================

Each text is encoded on its own (no padding). The perturbed copies of a text run batched
(``batch_size`` rows per forward); Integrated Gradients runs its ``n_steps`` points batched
(``internal_batch_size`` rows per forward). Captum's ``LayerDeepLift`` is not offered: its
rules only replace ``nn.ReLU``-style modules, and BERT's GELU module and functional softmax
fall back to plain gradients, so its scores break completeness (see the tests).

A new method is a frozen dataclass with a ``name``, a ``cost(n_tokens)`` (token-forwards
per text, for the budget check) and one verb, ``explain(problem) -> Explanation``, registered
in :data:`METHODS`; :func:`attribute` builds it from the shared options it has fields for.
Those shared pieces live in :mod:`attnprobe.attribution.method_base`, the perturbation methods
in :mod:`attnprobe.attribution.perturbation_methods`; all are importable from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from attnprobe.attribution.method_base import METHODS, Explanation, Method, Problem
from attnprobe.attribution.perturbation_methods import LeaveOneOut, Occlusion
from attnprobe.attribution.targets import Target, parse_target
from attnprobe.capture.text import Truncation, check_texts, encode
from attnprobe.core.checks import check_positive_ints
from attnprobe.core.optional import require
from attnprobe.core.registry import one_of
from attnprobe.core.tokens import special_ids
from attnprobe.errors import InputError
from attnprobe.types import TokenAttribution

__all__ = [
    "DEFAULT_METHODS",
    "METHODS",
    "PASS_TOKENS",
    "Explanation",
    "GradientShap",
    "InputXGradient",
    "IntegratedGradients",
    "LeaveOneOut",
    "Method",
    "Occlusion",
    "Problem",
    "Saliency",
    "attribute",
    "embedding_layer",
]

DEFAULT_METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "gradient_shap",
                   "leave_one_out")
# Integrated Gradients with internal_batch_size=None puts this many tokens (steps x text
# length) through the model per forward: all 50 steps of a 160-token text in one pass.
PASS_TOKENS = 8192
DEFAULT_BUDGET = 1_000_000


# ---------------------------------------------------------------------------- gradients
@METHODS.register("integrated_gradients")
@dataclass(frozen=True)
class IntegratedGradients:
    """Captum ``LayerIntegratedGradients`` on the input embedding layer.

    Args:
        n_steps: points on the straight path from the baseline (Gauss-Legendre rule).
        internal_batch_size: path points per forward; None: as many as fit in
            :data:`PASS_TOKENS` tokens (all of them for short texts). Chunking does not
            change the scores.
    """

    name: ClassVar[str] = "integrated_gradients"
    knob: ClassVar[str | None] = "n_steps"
    n_steps: int = 50
    internal_batch_size: int | None = None

    def __post_init__(self) -> None:
        check_positive_ints(self.name, n_steps=self.n_steps,
                            internal_batch_size=self.internal_batch_size)

    def cost(self, n_tokens: int) -> int:
        return (self.n_steps + 2) * n_tokens  # path points + input and baseline for delta

    def explain(self, problem: Problem) -> Explanation:
        captum = require("captum.attr")
        chunk = self.internal_batch_size or max(1, min(self.n_steps,
                                                       PASS_TOKENS // problem.n_tokens))
        ig = captum.LayerIntegratedGradients(problem.forward, problem.layer())
        attributions, delta = ig.attribute(
            problem.ids, baselines=problem.baseline_ids(),
            additional_forward_args=(problem.inputs["attention_mask"],),
            n_steps=self.n_steps, internal_batch_size=chunk, return_convergence_delta=True)
        return Explanation(attributions.sum(-1)[0], float(delta.abs().max()))


@dataclass(frozen=True)
class _LayerGradient:
    """∂target/∂(embedding output) for every token, one forward and backward."""

    name: ClassVar[str] = "_layer_gradient"
    knob: ClassVar[str | None] = None

    def cost(self, n_tokens: int) -> int:
        return n_tokens

    def _attributions(self, problem: Problem, *, multiply: bool) -> torch.Tensor:
        captum = require("captum.attr")
        method = captum.LayerGradientXActivation(problem.forward, problem.layer(),
                                                 multiply_by_inputs=multiply)
        out = method.attribute(problem.ids,
                               additional_forward_args=(problem.inputs["attention_mask"],))
        return out[0]  # [seq, d]


@METHODS.register("saliency")
@dataclass(frozen=True)
class Saliency(_LayerGradient):
    """``‖∂f/∂e_i‖₂`` over the embedding dimension."""

    name: ClassVar[str] = "saliency"

    def explain(self, problem: Problem) -> Explanation:
        return Explanation(self._attributions(problem, multiply=False).norm(dim=-1))


@METHODS.register("input_x_gradient")
@dataclass(frozen=True)
class InputXGradient(_LayerGradient):
    """``Σ_d e_i · ∂f/∂e_i`` (gradient × embedding)."""

    name: ClassVar[str] = "input_x_gradient"

    def explain(self, problem: Problem) -> Explanation:
        return Explanation(self._attributions(problem, multiply=True).sum(-1))


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch and numpy (Captum draws from both) and restore both afterwards."""
    state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state)


@METHODS.register("gradient_shap")
@dataclass(frozen=True)
class GradientShap:
    """Captum ``GradientShap`` on the embedding output (replaced through a hook).

    Args:
        n_samples: random (baseline, point on the path) draws, averaged.
        stdevs: Gaussian noise added to the input embedding of each draw.
        seed: seeds torch and numpy for the draws (the global states are restored).
    """

    name: ClassVar[str] = "gradient_shap"
    knob: ClassVar[str | None] = "n_samples"
    n_samples: int = 20
    stdevs: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_ints(self.name, n_samples=self.n_samples)

    def cost(self, n_tokens: int) -> int:
        return (self.n_samples + 2) * n_tokens

    def explain(self, problem: Problem) -> Explanation:
        captum = require("captum.attr")
        embeds = problem.embedded(problem.ids)  # [1, seq, d]
        pad = problem.embedded(problem.baseline_ids())
        keep = problem.special.view(1, -1, 1)
        zeros = torch.where(keep, embeds, torch.zeros_like(embeds))
        baselines = torch.cat([pad, zeros])  # [2, seq, d]
        shap = captum.GradientShap(problem.forward_from_embeddings)
        with _seeded(self.seed):
            out = shap.attribute(embeds, baselines=baselines, n_samples=self.n_samples,
                                 stdevs=self.stdevs,
                                 additional_forward_args=(problem.inputs["attention_mask"],))
        return Explanation(out.sum(-1)[0])


# ---------------------------------------------------------------------------- entry point
def embedding_layer(model: nn.Module, embedding: nn.Module | str | None = None) -> nn.Module | None:
    """The input embedding layer: ``embedding`` (a module or its path in ``model``), else
    ``model.get_input_embeddings()``, else the first ``nn.Embedding`` (None if there is none).
    """
    if isinstance(embedding, nn.Module):
        return embedding
    if isinstance(embedding, str):
        try:
            return model.get_submodule(embedding)
        except AttributeError:
            raise InputError(f"embedding {embedding!r} is not a module path in "
                             f"{type(model).__name__}") from None
    if embedding is not None:
        raise InputError(f"embedding must be a module or its path; got {type(embedding).__name__}")
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            layer = get()
        except (NotImplementedError, AttributeError):
            layer = None
        if isinstance(layer, nn.Module):
            return layer
    return next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def _build(method: str | Method, options: dict[str, Any]) -> Method:
    if not isinstance(method, str):
        if not (hasattr(method, "name") and callable(getattr(method, "explain", None))):
            raise InputError(f"method must be a name or a method object; got "
                             f"{type(method).__name__}")
        return method
    if method not in METHODS:
        raise InputError(one_of("attribution method", method, METHODS.names()))
    cls = METHODS.get(method)
    return cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})


def _token_id(tokenizer: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


def _check_ready(model: nn.Module) -> None:
    if torch.is_inference_mode_enabled():
        raise InputError("attribution needs gradients: call it outside torch.inference_mode()")
    if any(m.training for m in model.modules()):
        raise InputError("dropout makes attributions random: call model.eval()")
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise InputError(f"attribution explains encoder-only and decoder-only models; "
                         f"{type(model).__name__} is an encoder-decoder model")


def attribute(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str,
              target: str | Target | Callable[..., torch.Tensor],
              methods: Sequence[str | Method] = DEFAULT_METHODS, *, n_steps: int = 50,
              internal_batch_size: int | None = None, batch_size: int = 8,
              max_length: int | None = None, truncation: Truncation = "error", seed: int = 0,
              embedding: nn.Module | str | None = None, budget: int = DEFAULT_BUDGET,
              progress: bool = False) -> list[TokenAttribution]:
    """Score every token of every text for ``target`` with each method.

    Args:
        texts: the inputs; each is encoded on its own (no padding).
        target: a spec (``"class:1"``, ``"prob:0"``, ``"next-token"``, ``"next-token:464"``,
            ``"similarity:TEXT"``), a :class:`Target`, or a callable
            ``(output, inputs) -> Tensor[batch]``. ``next-token`` is fixed per text on the
            unperturbed forward; the result's ``target`` names the chosen token.
        methods: names in :data:`METHODS` or method objects (e.g.
            ``IntegratedGradients(n_steps=300)``).
        n_steps, internal_batch_size: Integrated Gradients path points, and points per
            forward (None: up to :data:`PASS_TOKENS` tokens per forward).
        batch_size: perturbed copies per forward (leave-one-out, occlusion).
        max_length, truncation: as in :func:`attnprobe.extract` (``"error"`` or ``"cut"``;
            one text at a time, so ``"skip"`` acts like ``"error"``).
        seed: seeds the random methods (gradient_shap); the same for every text.
        embedding: the input embedding layer (module or path) when the default pick is wrong.
        budget: the most token-forwards one method may spend on one text (tokens × forward
            rows: Integrated Gradients ``(n_steps + 2) × n``, gradient_shap
            ``(n_samples + 2) × n``, leave-one-out ``n × (n − 1)``, occlusion ``n²``); a text
            over it is an error naming what to lower.
        progress: show a progress bar over the texts.

    Returns:
        One :class:`~attnprobe.types.TokenAttribution` per (text, method), text-major:
        ``scores [token]``, ``tokens`` as ``tokenizer.convert_ids_to_tokens`` gives them,
        ``method`` the registry name, ``target`` the fixed target's spec, ``example_id``
        the text's index, ``delta`` Integrated Gradients' convergence error.

    Raises:
        InputError: empty texts, unknown method, inside ``torch.inference_mode()``, model in
            training mode, a text over ``budget``, or a bad target.

    Gradients are enabled locally, so calling this under ``torch.no_grad()`` works.

    Example:
        >>> model, tok = ap.load_model("minilm")
        >>> out = attribute(model, tok, ["A cat sat."], "similarity:A dog sat.",
        ...                 ["integrated_gradients", "leave_one_out"])
        >>> out[0].to_frame()
    """
    texts = check_texts(texts)
    _check_ready(model)
    check_positive_ints("attribute", n_steps=n_steps, internal_batch_size=internal_batch_size,
                        batch_size=batch_size, budget=budget)
    if isinstance(methods, str):
        methods = [methods]
    if not methods:
        raise InputError("give at least one attribution method; choose from "
                         + ", ".join(METHODS.names()))
    options = {"n_steps": n_steps, "internal_batch_size": internal_batch_size,
               "batch_size": batch_size, "seed": seed}
    built = [_build(m, options) for m in methods]
    target = parse_target(target, model, tokenizer)
    layer = embedding_layer(model, embedding)
    specials = special_ids(tokenizer)
    pad_id = _token_id(tokenizer, "pad_token_id", "unk_token_id")
    unk_id = _token_id(tokenizer, "unk_token_id")
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")

    encoded = [encode(model, tokenizer, [text], max_length=max_length, truncation=truncation)
               for text in texts]
    for i, batch in enumerate(encoded):
        n = int(batch["input_ids"].shape[1])
        for method in built:
            cost = method.cost(n)
            if cost > budget:
                lower = f"lower {method.knob}, " if method.knob else ""
                raise InputError(
                    f"{method.name} would run {cost:,} token-forwards on text {i} ({n} tokens),"
                    f" over budget={budget:,}: {lower}shorten the text (max_length=, "
                    "truncation='cut') or raise budget")

    indices: Sequence[int] | Any = range(len(texts))
    if progress:
        indices = require("tqdm").tqdm(indices, desc="attribute", unit="text")
    results: list[TokenAttribution] = []
    with torch.enable_grad():
        for i in indices:
            inputs = {k: v.to(device) for k, v in encoded[i].items()}
            with torch.no_grad():
                output = model(**inputs)
            fixed = target.fixed(output, inputs)
            value = float(fixed(output, inputs)[0])
            ids = inputs["input_ids"][0]
            special = torch.tensor([int(t) in specials for t in ids.tolist()],
                                   dtype=torch.bool, device=device)
            problem = Problem(model, inputs, fixed, value, special, pad_id, unk_id, layer,
                              seed=seed, batch_size=batch_size)
            tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
            for method in built:
                scores, delta = method.explain(problem)
                results.append(TokenAttribution(scores.detach(), tuple(tokens), method.name,
                                                fixed.spec, str(i), delta))
    return results
