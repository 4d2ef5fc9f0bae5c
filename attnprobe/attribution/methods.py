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
``attn_lrp``               AttnLRP (Achtibat et al. 2024): ``Σ_d e_i · ∂̃f/∂e_i`` with the
                           gradient modified by the LRP rules (ε for linear layers, identity
                           for activations and norms, uniform for the attention matmuls
                           and gates; :mod:`attnprobe.attribution.attn_lrp`); ``delta`` is
                           the conservation gap ``Σ_i R_i − f(x)``
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
in :mod:`attnprobe.attribution.perturbation_methods`, the gradient methods in
:mod:`attnprobe.attribution.gradient_methods`; all are importable from here.
:func:`attribute_inputs` explains already encoded inputs (e.g. the contexts of generated
tokens, which must not be re-tokenised).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import torch
from torch import nn

from attnprobe.attribution.attribution_options import ATTRIBUTION_FIELDS, AttributionOptions
from attnprobe.attribution.baseline import baseline_token
from attnprobe.attribution.gradient_methods import (
    PASS_TOKENS,
    GradientShap,
    InputXGradient,
    IntegratedGradients,
    Saliency,
)
from attnprobe.attribution.method_base import METHODS, Explanation, Method, Problem
from attnprobe.attribution.perturbation_methods import LeaveOneOut, Occlusion
from attnprobe.attribution.targets import Target, parse_target
from attnprobe.core.checks import check_positive_ints
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.optional import require
from attnprobe.core.registry import one_of
from attnprobe.core.residence import input_device
from attnprobe.core.tokens import special_ids
from attnprobe.errors import InputError
from attnprobe.inputs.prepared import prepare
from attnprobe.inputs.text import Text
from attnprobe.inputs.token_ids import input_embeddings, input_vocab_size
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
    "attribute_inputs",
    "embedding_layer",
]

DEFAULT_METHODS = ("integrated_gradients", "saliency", "input_x_gradient", "gradient_shap",
                   "leave_one_out")
DEFAULT_BUDGET = 1_000_000
BATCH_SIZE = 8  # perturbed copies per forward, unless the corpus options say otherwise


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
    layer = input_embeddings(model)
    if layer is not None:
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


def attribute(model: nn.Module, tokenizer: Any, texts: Sequence[Text] | str,
              target: str | Target | Callable[..., torch.Tensor],
              methods: Sequence[str | Method] = DEFAULT_METHODS, *,
              options: AttributionOptions | None = None,
              on_method: Callable[[str, str], None] | None = None,
              corpus: CorpusOptions | None = None, **keywords: Any) -> list[TokenAttribution]:
    """Score every token of every text for ``target`` with each method.

    Args:
        texts: the inputs; each is encoded on its own (no padding).
        target: a spec (``"class:1"``, ``"prob:0"``, ``"next-token"``, ``"next-token:464"``,
            ``"similarity:TEXT"``), a :class:`Target`, or a callable
            ``(output, inputs) -> Tensor[batch]``. ``next-token`` is fixed per text on the
            unperturbed forward; the result's ``target`` names the chosen token.
        methods: names in :data:`METHODS` or method objects (e.g.
            ``IntegratedGradients(n_steps=300)``).
        options: the attribution's own options (:class:`~attnprobe.attribution.
            attribution_options.AttributionOptions`: ``n_steps`` and
            ``internal_batch_size``, Integrated Gradients path points and points per forward
            — None: up to :data:`PASS_TOKENS` tokens per forward; ``embedding``, the input
            embedding layer, module or path, when the default pick is wrong).
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`, or its fields by name) and the attribution options by name
            (``n_steps=16``): ``batch_size``, perturbed copies per forward (leave-one-out,
            occlusion; default 8); ``max_length``, ``truncation`` as in
            :func:`attnprobe.extract` (``"error"`` or ``"cut"``; one text at a time, so
            ``"skip"`` acts like ``"error"``); ``seed``, the random methods (gradient_shap),
            the same for every text; ``budget``, the most token-forwards one method may
            spend on one text (tokens × forward rows: Integrated Gradients
            ``(n_steps + 2) × n``, gradient_shap ``(n_samples + 2) × n``, leave-one-out
            ``n × (n − 1)``, occlusion ``n²``; default :data:`DEFAULT_BUDGET`), a text over
            it is an error naming what to lower; ``progress``, a progress bar over the
            texts. ``scope`` and ``distributed`` do not apply (every token is scored, in
            this process).
        on_method: called as ``on_method(example_id, method_name)`` just before each method
            runs on each text (e.g. to drive a progress bar of its own).

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
        ...                 ["integrated_gradients", "leave_one_out"], n_steps=16)
        >>> [(a.method, len(a.tokens)) for a in out]    # [CLS] a cat sat . [SEP]
        [('integrated_gradients', 6), ('leave_one_out', 6)]
        >>> out[0].to_frame()
    """
    walk, opts = _options(corpus, options, keywords, "attribute()")
    # everything that can be refused is refused before the texts are encoded
    built = _methods(model, methods, walk, opts)
    target = parse_target(target, model, tokenizer)
    prepared = prepare(model, tokenizer, texts)  # strings or token ids, tokenized once
    encoded = [prepared.inputs([i], max_length=walk.max_length, truncation=walk.truncation)
               for i in range(len(prepared))]
    return attribute_inputs(model, tokenizer, encoded, target, built, options=opts,
                            on_method=on_method, corpus=walk)


def attribute_inputs(model: nn.Module, tokenizer: Any,
                     inputs: Sequence[Mapping[str, torch.Tensor]],
                     target: str | Target | Callable[..., torch.Tensor],
                     methods: Sequence[str | Method] = DEFAULT_METHODS, *,
                     example_ids: Sequence[str] | None = None,
                     options: AttributionOptions | None = None,
                     on_method: Callable[[str, str], None] | None = None,
                     corpus: CorpusOptions | None = None, **keywords: Any
                     ) -> list[TokenAttribution]:
    """:func:`attribute` on inputs that are already encoded, one example each; the arguments
    not listed here are :func:`attribute`'s.

    Args:
        inputs: per example ``{"input_ids": [1, seq], "attention_mask": [1, seq]}`` (no
            padding; the mask may be left out).
        example_ids: ``example_id`` of each result (default the position in ``inputs``).

    Example:
        >>> ids = lm_tok([prompt], return_tensors="pt")          # one example: [1, seq]
        >>> found = attribute_inputs(lm, lm_tok, [ids], "next-token",
        ...                          ["saliency", "leave_one_out"])
        >>> [(a.method, len(a.tokens)) for a in found]
        [('saliency', 17), ('leave_one_out', 17)]
        >>> float(found[1].scores[0])                   # [BOS] is special: never deleted
        0.0
    """
    walk, opts = _options(corpus, options, keywords, "attribute_inputs()")
    built = _methods(model, methods, walk, opts)
    budget, batch_size, seed = walk.budget or DEFAULT_BUDGET, walk.batch(BATCH_SIZE), walk.seed
    target = parse_target(target, model, tokenizer)
    layer = embedding_layer(model, opts.embedding)
    specials = special_ids(tokenizer)
    baseline = baseline_token(tokenizer, input_vocab_size(model))
    unk_id = _token_id(tokenizer, "unk_token_id")
    device = input_device(model)
    encoded = [_one_input(batch, i) for i, batch in enumerate(inputs)]
    if not encoded:
        raise InputError("no input to attribute")
    ids = [str(i) for i in range(len(encoded))] if example_ids is None else list(example_ids)
    if len(ids) != len(encoded):
        raise InputError(f"{len(ids)} example ids for {len(encoded)} inputs")
    for i, batch in enumerate(encoded):
        n = int(batch["input_ids"].shape[1])
        for method in built:
            cost = method.cost(n)
            if cost > budget:
                lower = f"lower {method.knob}, " if method.knob else ""
                raise InputError(
                    f"{method.name} would run {cost:,} token-forwards on text {ids[i]} ({n} "
                    f"tokens), over budget={budget:,}: {lower}shorten the text (max_length=, "
                    "truncation='cut') or raise budget")

    indices: Sequence[int] | Any = range(len(encoded))
    if walk.progress:
        indices = require("tqdm").tqdm(indices, desc="attribute", unit="text")
    results: list[TokenAttribution] = []
    with torch.enable_grad():
        for i in indices:
            batch = {k: v.to(device) for k, v in encoded[i].items()}
            with torch.no_grad():
                output = model(**batch)
            fixed = target.fixed(output, batch)
            value = float(fixed(output, batch)[0])
            row = batch["input_ids"][0]
            special = torch.tensor([int(t) in specials for t in row.tolist()],
                                   dtype=torch.bool, device=device)
            problem = Problem(model, batch, fixed, value, special,
                              None if baseline is None else baseline.id, unk_id, layer,
                              seed=seed, batch_size=batch_size,
                              baseline_note=None if baseline is None else baseline.note())
            tokens = tokenizer.convert_ids_to_tokens(row.tolist())
            for method in built:
                if on_method is not None:
                    on_method(ids[i], method.name)
                scores, delta = method.explain(problem)
                results.append(TokenAttribution(scores.detach(), tuple(tokens), method.name,
                                                fixed.spec, ids[i], delta))
    return results


def _options(corpus: CorpusOptions | None, options: AttributionOptions | None,
             keywords: Mapping[str, Any], owner: str
             ) -> tuple[CorpusOptions, AttributionOptions]:
    """The corpus options and the attribution's own, each with its keywords folded in."""
    given, own = CorpusOptions.split(keywords)
    walk = CorpusOptions.merged(corpus, given, own=ATTRIBUTION_FIELDS, owner=owner)
    return walk, (options or AttributionOptions()).with_keywords(own, owner)


def _methods(model: nn.Module, methods: Sequence[str | Method] | str, walk: CorpusOptions,
             opts: AttributionOptions) -> list[Method]:
    """The method objects, after the checks every attribution makes before any forward."""
    _check_ready(model)
    check_positive_ints("attribute", n_steps=opts.n_steps,
                        internal_batch_size=opts.internal_batch_size)
    if isinstance(methods, str):
        methods = [methods]
    if not methods:
        raise InputError("give at least one attribution method; choose from "
                         + ", ".join(METHODS.names()))
    built = {"n_steps": opts.n_steps, "internal_batch_size": opts.internal_batch_size,
             "batch_size": walk.batch(BATCH_SIZE), "seed": walk.seed}
    found = [_build(m, built) for m in methods]
    for method in found:  # a method that reads the model's layout refuses it before any forward
        if callable(check := getattr(method, "check", None)):
            check(model)
    return found


def _one_input(batch: Mapping[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` ``[1, seq]`` of one encoded example (checked)."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[0] != 1 \
            or ids.shape[1] < 1:
        raise InputError(f"input {i} must hold input_ids of shape [1, seq]")
    mask = batch.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape or not bool(mask.all()):
        raise InputError(f"input {i}: attention_mask must be all ones of the ids' shape "
                         "(one example, no padding)")
    return {"input_ids": ids, "attention_mask": mask}
