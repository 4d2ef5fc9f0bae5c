"""Token importance that runs the model: attention × gradient and norm-based attention.

- :func:`attention_x_gradient` — Chefer, Gur & Wolf (2021) generic rule:
  ``Ā_l = mean_h[(∂y/∂A_l ⊙ A_l)^+]``, ``R ← R + Ā_l·R`` from ``R = I``.
- :func:`norm_based` / :func:`norm_importance` — Kobayashi et al. (2020): ``‖α_ij f(x_j)‖`` with
  ``f(x_j) = (x_j W_V^h + b_V^h) W_O^h``.

Both run the model themselves (registered as the ``attn_x_grad`` and ``norm`` views, with
``needs_model``), encoding the text with the same ``truncation`` / ``max_length`` as the map
views, so every view sees the same tokens. The query spec is described in
:mod:`attnprobe.attribution.views`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from attnprobe.attribution.targets import TargetFn
from attnprobe.attribution.view_base import VIEWS, View, ViewInput
from attnprobe.attribution.view_common import Query, one_text, read_query, resolve_query
from attnprobe.capture import Keep, Live, Values, capture
from attnprobe.capture.info import causal_of
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation, encode, model_inputs
from attnprobe.types import TokenAttribution
from attnprobe.weights.head_weights import row_matrix

__all__ = ["NORM_FAMILIES", "AttnXGradView", "NormView", "attention_x_gradient", "norm_based",
           "norm_importance"]

# model_type -> family whose output projection norm_based knows how to slice
NORM_FAMILIES = {
    "bert": "bert", "roberta": "bert", "xlm-roberta": "bert",
    "gpt2": "gpt2",
    "llama": "llama", "mistral": "llama", "qwen2": "llama",
}


def _self_sites(sites: Sequence[Site]) -> list[Site]:
    """Self-attention sites of the first stack (the encoder of encoder-decoder models), by
    layer."""
    own = [s for s in sites if s.kind == "self"]
    if not own:
        raise InputError("the model has no self-attention site to read")
    stack = min(own, key=lambda s: (s.side != "main", s.layer)).stack
    return sorted((s for s in own if s.stack == stack), key=lambda s: s.layer)


def target_name(target: Any) -> str:
    return str(getattr(target, "spec", "custom"))


def _require_grad_on_embeddings(model: nn.Module, stack: ExitStack) -> None:
    """A frozen model (no parameter requires grad) still needs a graph through the attention:
    make the input embeddings require grad for this call (hook removed by ``stack``)."""
    if any(p.requires_grad for p in model.parameters()):
        return
    getter = getattr(model, "get_input_embeddings", None)
    embeddings = getter() if callable(getter) else None
    if not isinstance(embeddings, nn.Module):
        return

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.detach().requires_grad_(True)

    stack.callback(embeddings.register_forward_hook(hook).remove)


def _batch(model: nn.Module, tokenizer: Any, text: str, truncation: Truncation,
           max_length: int | None, inputs: dict[str, torch.Tensor] | None
           ) -> dict[str, torch.Tensor]:
    """The encoded text (or the given ``inputs``) on the model's device, ``[1, seq]``."""
    if inputs is None:
        inputs = encode(model, tokenizer, one_text(text), truncation=truncation,
                        max_length=max_length)
    return model_inputs(model, dict(inputs))


def attn_x_grad_matrix(model: nn.Module, tokenizer: Any, text: str, target: TargetFn, *,
                       truncation: Truncation = "error", max_length: int | None = None,
                       inputs: dict[str, torch.Tensor] | None = None
                       ) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Chefer's relevance matrix ``R`` ``[query, key]`` (float64) and the tokens; ``inputs``
    (``[1, seq]`` ids and mask) replace the text when given."""
    if inputs is None:
        one_text(text)
    if not callable(target):
        raise InputError(f"target must be callable (output, inputs) -> Tensor[batch]; got "
                         f"{type(target).__name__}")
    if torch.is_inference_mode_enabled():
        raise InputError("attention × gradient needs gradients; call it outside "
                         "torch.inference_mode()")
    inputs = _batch(model, tokenizer, text, truncation, max_length, inputs)
    with torch.enable_grad():
        with ExitStack() as stack:
            _require_grad_on_embeddings(model, stack)
            cap = stack.enter_context(capture(model, parts=[Live()]))
            output = model(**inputs)
        fixed = getattr(target, "fixed", None)
        if callable(fixed):  # e.g. next-token: pick the token from this forward, then score
            target = fixed(output, inputs)
        score = target(output, inputs)
        if not isinstance(score, torch.Tensor) or score.numel() != 1:
            raise InputError(f"target {target_name(target)!r} must return one value for the "
                             f"one text; got {getattr(score, 'shape', type(score).__name__)}")
        if not cap.live:
            raise InputError("no attention was captured during the forward")
        sites = _self_sites(list(cap.live[0]))
        patterns = [cap.live[0][s] for s in sites]
        if not score.requires_grad or not any(p.requires_grad for p in patterns):
            raise InputError(f"no gradient reaches the attention from target "
                             f"{target_name(target)!r} (detached output, or weights without "
                             "autograd support)")
        grads = torch.autograd.grad(score.sum(), patterns, allow_unused=True)
    n = patterns[0].shape[-1]
    if any(p.shape[-2] != p.shape[-1] for p in patterns):  # e.g. a single learned query
        raise InputError("attention × gradient rolls relevance through square token-to-token "
                         "self-attention; this model's attention has "
                         f"{patterns[0].shape[-2]} query row(s) over {n} keys (use the raw view)")
    relevance = torch.eye(n, dtype=torch.float64)
    for pattern, grad in zip(patterns, grads, strict=True):
        if grad is None:  # this layer does not influence the target
            continue
        a = pattern.detach()[0].to("cpu", torch.float64)
        g = grad[0].to("cpu", torch.float64)
        cam = (g * a).clamp(min=0).mean(0)  # [query, key]
        relevance = relevance + cam @ relevance
    if not torch.isfinite(relevance).all():
        raise InputError(f"attention × gradient for target {target_name(target)!r} is not "
                         "finite (NaN or inf gradients)")
    ids = inputs["input_ids"][0].tolist()
    tokens = tuple(tokenizer.convert_ids_to_tokens(ids)) \
        if hasattr(tokenizer, "convert_ids_to_tokens") else tuple(str(i) for i in ids)
    return relevance, tokens


def attention_x_gradient(model: nn.Module, tokenizer: Any, text: str, target: TargetFn, *,
                         query: Query = "auto", truncation: Truncation = "error",
                         max_length: int | None = None) -> torch.Tensor:
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, generic rule).

    For every self-attention layer in order, ``Ā_l = mean_h[(∂y/∂A_l ⊙ A_l)^+]`` with ``y`` the
    target, and ``R ← R + Ā_l·R`` starting from ``R = I``; the importance is row ``query`` of
    ``R``. The gradients come from :func:`attnprobe.capture` (``live=True``) and
    ``torch.autograd.grad`` (so no parameter's ``.grad`` is touched). A model with every
    parameter frozen works too (the input embeddings are made to require grad for the call).

    Args:
        text: one input text.
        target: ``(output, inputs) -> Tensor[batch]``, the value explained (e.g. a class logit);
            its ``.spec`` (if any) names it.
        query: which row of ``R`` to read (``"auto"``: the last token of a causal model,
            the first of any other).
        truncation, max_length: for a text longer than the model allows
            (:mod:`attnprobe.inputs.text`).

    Returns:
        ``[key]`` float64 (``R`` includes the identity, so the query's own token has >= 1).

    Raises:
        InputError: inside ``torch.inference_mode()``, or when no gradient reaches the attention.

    Example:
        >>> target = ap.attribution.parse_target("next-token", lm, lm_tok)
        >>> relevance = attention_x_gradient(lm, lm_tok, prompt, target)
        >>> relevance.shape                             # [key]: the last token's row of R
        torch.Size([17])
        >>> bool(relevance[-1] >= 1)                    # R starts from I
        True
    """
    relevance, _ = attn_x_grad_matrix(model, tokenizer, text, target, truncation=truncation,
                                      max_length=max_length)
    return read_query(relevance, resolve_query(query, causal_of(model)))


def check_norm_family(model: nn.Module) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in NORM_FAMILIES:
        raise InputError(f"norm-based importance resolves the attention output projection of "
                         f"model types {', '.join(sorted(NORM_FAMILIES))} only; got "
                         f"{model_type or type(model).__name__}")


def _out_projection(model: nn.Module, site: Site) -> nn.Module:
    """The attention output projection of a site (``nn.Linear``, or GPT-2's ``Conv1D``)."""
    check_norm_family(model)
    model_type = model.config.model_type
    family = NORM_FAMILIES[model_type]
    path = {"bert": site.path.rsplit(".", 1)[0] + ".output.dense",
            "gpt2": site.path + ".c_proj", "llama": site.path + ".o_proj"}[family]
    try:
        module = model.get_submodule(path)
    except AttributeError:
        module = None
    conv = type(module).__name__ == "Conv1D"
    if module is None or not (isinstance(module, nn.Linear) or conv):
        raise InputError(f"expected the {family} attention output projection at {path!r} "
                         f"(model type {model_type}); not found")
    return module


def norm_parts(model: nn.Module, tokenizer: Any, text: str, layers: Sequence[int], *,
               truncation: Truncation = "error", max_length: int | None = None,
               inputs: dict[str, torch.Tensor] | None = None
               ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], tuple[str, ...]]:
    """Per layer: weights ``α`` ``[head, query, key]`` and ``f(x_j)`` ``[head, key, d_model]``
    (float64, CPU), and the tokens. One forward for all layers; ``inputs`` (``[1, seq]``)
    replace the text when given."""
    layers = list(layers)
    inputs = _batch(model, tokenizer, text, truncation, max_length, inputs)
    with torch.no_grad(), capture(model, layers=layers, parts=[Keep(), Values()],
                                  tokenizer=tokenizer) as cap:
        model(**inputs)
    if not cap.values:
        raise InputError("no value vectors were captured (norm-based importance needs a "
                         "transformers model)")
    sites = {s.layer: s for s in _self_sites(list(cap.values[0]))}
    amap = next(m for m in cap.maps if m.kind == "self" and m.stack == sites[layers[0]].stack)
    parts = {}
    for layer in layers:
        site = sites[layer]
        # read where the weight lives (an offload hook loads it; int8 is dequantized)
        w, _ = row_matrix(_out_projection(model, site))
        w = w.to("cpu", torch.float64)  # [in = head·d_head, out = d_model]
        value = cap.values[0][site][0].to("cpu", torch.float64)  # [head, key, d_head]
        n_heads, _, d_head = value.shape
        if w.shape[0] != n_heads * d_head:
            raise InputError(f"output projection of {site.path} takes {w.shape[0]} inputs, not "
                             f"{n_heads} heads × {d_head}")
        f = torch.einsum("hkd,hdo->hko", value, w.reshape(n_heads, d_head, -1))
        alpha = amap.pattern[amap.layers.index(layer)].to(torch.float64)
        parts[layer] = (alpha, f)
    return parts, amap.key_tokens


def norm_heads(norms: torch.Tensor, heads: int | Sequence[int] | None) -> torch.Tensor:
    """``[query, key]``: the mean of ``norms`` ``[head, query, key]`` over ``heads`` (model head
    indices; ``None``: every head)."""
    if heads is None:
        return norms.mean(0)
    chosen = list(heads) if isinstance(heads, Sequence) else [heads]
    n = norms.shape[0]
    if not chosen or any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n
                         for h in chosen):
        raise InputError(f"head {heads!r} out of range (0..{n - 1})")
    return norms[chosen].mean(0)


def norm_based(model: nn.Module, tokenizer: Any, text: str, *, layer: int,
               truncation: Truncation = "error", max_length: int | None = None
               ) -> torch.Tensor:
    """Norm-based attention (Kobayashi et al. 2020): ``‖α_ij f(x_j)‖ = α_ij·‖f(x_j)‖``.

    ``f(x_j) = (x_j W_V^h + b_V^h) W_O^h``: the value vector of key ``j`` in head ``h`` (from
    :func:`attnprobe.capture`, ``values=True``) times the head's ``d_head`` input slice of the
    attention output projection; the output bias is excluded (it does not depend on ``j``).
    Supported: BERT-like models (bert, roberta, xlm-roberta: ``...attention.output.dense``),
    GPT-2 (``attn.c_proj``), LLaMA / Mistral / Qwen2 (``self_attn.o_proj``).

    Args:
        truncation, max_length: for a text longer than the model allows
            (:mod:`attnprobe.inputs.text`).

    Returns:
        ``[head, query, key]`` float64.

    Raises:
        InputError: for any other model.

    Example:
        >>> norms = norm_based(model, tok, texts[0], layer=0)   # MiniLM: a BERT model
        >>> norms.shape                                 # [head, query, key]
        torch.Size([12, 9, 9])
        >>> bool((norms >= 0).all())
        True
    """
    check_norm_family(model)
    parts, _ = norm_parts(model, tokenizer, text, [layer], truncation=truncation,
                          max_length=max_length)
    alpha, f = parts[layer]
    return alpha * f.norm(dim=-1)[:, None, :]


def norm_importance(model: nn.Module, tokenizer: Any, text: str, *, layer: int,
                    head: int | Sequence[int] | None = None, query: Query = "auto",
                    truncation: Truncation = "error", max_length: int | None = None
                    ) -> torch.Tensor:
    """One query row of :func:`norm_based`, averaged over ``head`` (one model head index or
    several; ``None``: every head).

    Returns:
        ``[key]`` float64.

    Example:
        >>> row = norm_importance(model, tok, texts[0], layer=0)   # the [CLS] row (encoder)
        >>> row.shape                                   # [key]
        torch.Size([9])
        >>> torch.allclose(row, norm_based(model, tok, texts[0], layer=0).mean(0)[0])
        True
    """
    norms = norm_based(model, tokenizer, text, layer=layer, truncation=truncation,
                       max_length=max_length)
    return read_query(norm_heads(norms, head), resolve_query(query, causal_of(model)))


# ----------------------------------------------------------------------------- the views
@VIEWS.register("attn_x_grad")
class AttnXGradView(View):
    """``attn_x_grad``: the query row of Chefer's relevance, through every head and layer."""

    name = "attn_x_grad"
    summary = ("attention × gradient (Chefer et al.'s generic rule, gradients through "
               "`capture(live=True)`), through every head")
    needs_model = True
    needs_target = True

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        relevance, tokens = attn_x_grad_matrix(inp.model, inp.tokenizer, inp.text, inp.target,
                                               truncation=inp.truncation,
                                               max_length=inp.max_length, inputs=inp.inputs)
        return [inp.result(read_query(relevance, inp.query), tokens, self.name,
                           target_name(inp.target))]


@VIEWS.register("norm")
class NormView(View):
    """``norm@L{layer}``: the query row of ``‖α f(x)‖``, mean over the scope's heads."""

    name = "norm"
    summary = "the norm-based ‖α f(x)‖ (Kobayashi et al.; BERT/RoBERTa, GPT-2, LLaMA/Mistral/Qwen2)"
    needs_model = True

    def check(self, model: nn.Module | None) -> None:
        check_norm_family(model)

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        layers = inp.layers
        parts, tokens = norm_parts(inp.model, inp.tokenizer, inp.text, layers,
                                   truncation=inp.truncation, max_length=inp.max_length,
                                   inputs=inp.inputs)
        results = []
        for layer in layers:
            alpha, f = parts[layer]
            norms = alpha * f.norm(dim=-1)[:, None, :]  # [head, query, key]
            results.append(inp.result(read_query(norm_heads(norms, inp.heads(layer)),
                                                 inp.query), tokens, f"{self.name}@L{layer}"))
        return results
