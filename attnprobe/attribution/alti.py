"""ALTI (Ferrando, Gállego & Costa-jussà 2022): token-to-token contributions read off the
attention block's decomposition, rolled out over the layers.

For each layer and query token ``i`` the attention block's output ``y_i`` (after the residual
and, in a post-norm model, the layer norm) is written as a sum of one vector per input token
plus a constant:

``y_i = Σ_j T_i(x_j) + b_i``

- **post-norm** (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT: ``y = LayerNorm(dense(z) + x)``):
  ``u_ij = Σ_h α_hij v_hj W_O^h + [j = i] x_i`` (``v_hj = x_j W_V^h + b_V^h``, captured),
  ``T_i(x_j) = (u_ij − mean(u_ij)) / σ_i ⊙ γ`` with ``σ_i`` the norm's scale of row ``i``
  *frozen at the run's value* (so the norm is affine), and
  ``b_i = (b_O − mean(b_O)) / σ_i ⊙ γ + β``;
- **pre-norm** (GPT-2, LLaMA layout: ``y = x + o_proj(attn(norm(x)))``): ``T_i(x_j) = u_ij``
  (the norm acts inside ``v_hj``, each token with its own frozen scale), ``b_i = b_O``.

Every decomposition is checked at run time against the block's own output: a relative gap
above :data:`ALTI_TOLERANCE` is an :class:`~attnprobe.errors.InputError`, never a wrong
table. The contribution of ``j`` to ``i`` is the paper's proximity
``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, normalised over ``j`` (a row with no positive
proximity keeps zeros); the per-layer matrices ``C_l [query, key]`` are rolled out,
``R_1 = C_1``, ``R_l = C_l · R_{l−1}`` (the residual is already inside ``C_l``, so no identity
is added), and the view ``alti@L{layer}`` reads the query row of ``R_layer``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnprobe.attribution.view_base import VIEWS, View, ViewInput
from attnprobe.attribution.view_common import Query, one_unpadded_input, read_query, resolve_query
from attnprobe.capture import Activations, Keep, capture
from attnprobe.capture.discovery import hf_sites
from attnprobe.capture.info import causal_of
from attnprobe.core.residence import loaded
from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation
from attnprobe.types import TokenAttribution
from attnprobe.weights.anatomy import Anatomy, anatomy
from attnprobe.weights.head_weights import row_matrix

__all__ = ["ALTI_TOLERANCE", "PART_BYTES", "AltiLayer", "AltiView", "alti", "alti_layers",
           "alti_matrix", "alti_tolerance", "contributions", "iter_alti_layers", "rollout"]

ALTI_TOLERANCE = 1e-4
"""The largest gap ``max|Σ_j T_i(x_j) + b_i − y_i| / max|y_i|`` of a float32 layer."""


def alti_tolerance(dtype: torch.dtype) -> float:
    """The gap accepted for a layer computed in ``dtype``: the layer rounded its output up to
    5 times (α·v, output projection, residual sum, post-norm), each by at most the unit
    roundoff of the largest entry: ``5u``, at least :data:`ALTI_TOLERANCE`.

    Example:
        >>> alti_tolerance(torch.float32), alti_tolerance(torch.bfloat16)
        (0.0001, 0.01953125)
    """
    if not dtype.is_floating_point:
        return ALTI_TOLERANCE
    return max(ALTI_TOLERANCE, 5 * torch.finfo(dtype).eps / 2)

PART_BYTES = 256 * 2**20
"""The most memory one block of ``[row, key, d_model]`` float64 parts takes in :func:`alti`
and the view (a long text's layer is decomposed a block of query rows at a time)."""

POST_NORM_TYPES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert")


@dataclass(frozen=True)
class AltiLayer:
    """One layer's decomposition (float64, CPU).

    Attributes:
        layer: the model layer index.
        parts: ``T_i(x_j)`` ``[query, key, d_model]`` (query rows ``first_row`` on: a layer
            may come in several blocks of rows, :func:`iter_alti_layers`).
        bias: ``b_i`` ``[query, d_model]`` (what no token contributes).
        output: the block's own output ``y`` ``[query, d_model]``.
        gap: the relative reconstruction gap (checked ``<= alti_tolerance(dtype)``).
        first_row: the query row of ``parts[0]``.
    """

    layer: int
    parts: torch.Tensor
    bias: torch.Tensor
    output: torch.Tensor
    gap: float
    first_row: int = 0


def contributions(parts: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """The paper's normalised proximity ``[query, key]`` of ``parts`` ``[query, key, d]``
    to ``output`` ``[query, d]``: ``max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)`` over its row sum.

    Example:
        >>> parts = torch.tensor([[[1.0, 0.0], [0.0, 3.0]]], dtype=torch.float64)  # [1, 2, 2]
        >>> contributions(parts, parts.sum(1))          # ‖y‖₁ = 4: proximities 1 and 3
        tensor([[0.2500, 0.7500]], dtype=torch.float64)
    """
    distance = (parts - output[:, None, :]).abs_().sum(-1)  # [query, key]
    proximity = (output.abs().sum(-1, keepdim=True) - distance).clamp(min=0)
    total = proximity.sum(-1, keepdim=True)
    return torch.where(total > 0, proximity / total.clamp_min(torch.finfo(total.dtype).tiny),
                       torch.zeros_like(proximity))


# ----------------------------------------------------------------------------- blocks
@dataclass(frozen=True)
class _Block:
    """Where one layer's pieces are: the module whose input ``x_arg`` (position, keyword) is
    the residual ``x``, the attention module (pre-norm: its ``output[0]`` is added to ``x``),
    the output projection and the norm (post-norm: its output is ``y``)."""

    post_norm: bool
    x_module: nn.Module
    x_arg: tuple[int, str]
    attn: nn.Module | None
    out_proj: nn.Module
    norm: nn.Module


def _model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", "") or "")


def _post_norm_block(model: nn.Module, path: str) -> _Block:
    """The post-norm block around the attention site at ``path``: BERT's
    ``attention.output`` (``dense``, ``LayerNorm``, called as ``(z, input_tensor=x)``) or
    DistilBERT's block (``attention.out_lin``, ``sa_layer_norm``, called with ``x``)."""
    parent = path.rsplit(".", 1)[0]
    if _model_type(model) == "distilbert":
        block, attn = model.get_submodule(parent), model.get_submodule(path)
        out, norm = getattr(attn, "out_lin", None), getattr(block, "sa_layer_norm", None)
        if isinstance(out, nn.Linear) and isinstance(norm, nn.LayerNorm):
            return _Block(True, block, (0, "hidden_states"), None, out, norm)
    else:
        try:
            out = model.get_submodule(parent + ".output")
        except AttributeError:
            out = None
        dense, norm = getattr(out, "dense", None), getattr(out, "LayerNorm", None)
        if isinstance(dense, nn.Linear) and isinstance(norm, nn.LayerNorm):
            return _Block(True, out, (1, "input_tensor"), None, dense, norm)
    raise InputError(f"ALTI: expected a {_model_type(model)} attention output projection and "
                     f"layer norm next to {path!r}; not found")


def _blocks(model: nn.Module, paths: dict[int, str]) -> dict[int, _Block]:
    """Per layer (site path by layer), the block's pieces; one-line refusal otherwise."""
    if _model_type(model) in POST_NORM_TYPES:
        return {layer: _post_norm_block(model, path) for layer, path in paths.items()}
    body = _pre_norm(model)
    return {layer: _Block(False, body.layers[layer].norm, (0, "hidden_states"),
                          body.layers[layer].attn, body.layers[layer].out_proj,
                          body.layers[layer].norm) for layer in paths}


def _pre_norm(model: nn.Module) -> Anatomy:
    """The pre-norm model's :class:`~attnprobe.weights.anatomy.Anatomy`, or a one-line
    refusal naming what ALTI reads."""
    try:
        return anatomy(model)
    except InputError:
        kind = _model_type(model) or type(model).__name__
        raise InputError(f"ALTI supports post-norm BERT/RoBERTa/XLM-R/ELECTRA/DistilBERT "
                         f"blocks and pre-norm GPT-2 / LLaMA-layout blocks; {kind} is "
                         "neither") from None


def _first_tensor(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value


def _watch(block: _Block, store: dict[str, torch.Tensor], stack: ExitStack) -> None:
    """Hooks that keep the block's residual input ``x`` and, post-norm, its output ``y`` /
    pre-norm, the attention's output ``a`` (``[seq, d_model]``)."""
    def grab(name: str, tensor: torch.Tensor) -> None:
        store[name] = tensor.detach()[0].to("cpu", torch.float64)

    position, keyword = block.x_arg

    def read_x(module: nn.Module, args: tuple, kwargs: dict) -> None:
        grab("x", args[position] if len(args) > position else kwargs[keyword])

    def read_y(module: nn.Module, args: tuple, output: Any) -> None:
        grab("y" if block.post_norm else "a", _first_tensor(output))

    stack.callback(block.x_module.register_forward_pre_hook(read_x, with_kwargs=True).remove)
    source = block.norm if block.post_norm else block.attn
    stack.callback(source.register_forward_hook(read_y).remove)


def _decompose(layer: int, block: _Block, alpha: torch.Tensor, value: torch.Tensor,
               store: dict[str, torch.Tensor], where: str, rows: slice) -> AltiLayer:
    """Query ``rows`` of one layer; ``alpha`` ``[head, query, key]``, ``value`` ``[head,
    key, d_head]`` (float64)."""
    w, b = row_matrix(block.out_proj)
    w = w.to("cpu", torch.float64)
    n_heads, n, d_head = value.shape
    if w.shape[0] != n_heads * d_head:
        raise InputError(f"ALTI: the output projection at {where} takes {w.shape[0]} inputs, "
                         f"not {n_heads} heads × {d_head}")
    f = torch.einsum("hkd,hdo->hko", value, w.reshape(n_heads, d_head, -1))  # [h, key, d]
    x = store["x"][:n]
    u = torch.einsum("hqk,hko->qko", alpha[:, rows], f)  # [row, key, d] (in place from here)
    u.diagonal(rows.start, 0, 1).add_(x[rows].T)  # the residual: x_i to itself
    b_o = torch.zeros(w.shape[1], dtype=torch.float64) if b is None \
        else b.to("cpu", torch.float64)
    if block.post_norm:
        norm = block.norm
        with loaded(norm):  # offloaded: on the meta device between forwards
            gamma = norm.weight.detach().to("cpu", torch.float64)
            beta = norm.bias.detach().to("cpu", torch.float64)
        pre = u.sum(1) + b_o  # [query, d]: the norm's input, rebuilt
        sigma = (pre.var(-1, unbiased=False) + norm.eps).sqrt()  # [query], frozen
        parts = u.sub_(u.mean(-1, keepdim=True)).mul_((gamma / sigma[:, None])[:, None, :])
        bias = (b_o - b_o.mean())[None, :] / sigma[:, None] * gamma + beta
        output = store["y"][rows]
    else:
        parts, bias = u, b_o.expand(u.shape[0], -1)
        output = x[rows] + store["a"][rows]
    rebuilt = parts.sum(1) + bias
    gap = float((rebuilt - output).abs().max() / output.abs().max().clamp_min(1e-30))
    tolerance = alti_tolerance(block.out_proj.weight.dtype)
    if not gap <= tolerance:
        raise InputError(f"ALTI: the decomposition of {where} does not add up to the layer's "
                         f"output (relative gap {gap:.2e} > {tolerance:g}); the model "
                         "computes something this layout does not describe")
    return AltiLayer(layer, parts, bias, output, gap, rows.start)


# ----------------------------------------------------------------------------- entry points
def alti_layers(model: nn.Module, tokenizer: Any, text: str, *,
                truncation: Truncation = "error", max_length: int | None = None,
                inputs: dict[str, torch.Tensor] | None = None
                ) -> tuple[list[AltiLayer], tuple[str, ...]]:
    """Every self-attention layer's checked decomposition (in order) and the tokens; one
    forward. ``inputs`` (``[1, seq]`` ids and mask) replace the text when given. Holds every
    layer's ``[query, key, d_model]`` parts at once: :func:`iter_alti_layers` holds one.

    Raises:
        InputError: an unsupported family, a model in training mode, padded or batched
            ``inputs``, or a decomposition that does not add up to the layer's output.

    Example:
        >>> layers, tokens = alti_layers(model, tok, texts[0])   # MiniLM: 6 post-norm layers
        >>> len(layers), layers[0].parts.shape          # [query, key, d_model]
        (6, torch.Size([9, 9, 384]))
        >>> bool(max(one.gap for one in layers) <= ALTI_TOLERANCE)
        True
    """
    found, tokens = iter_alti_layers(model, tokenizer, text, truncation=truncation,
                                     max_length=max_length, inputs=inputs)
    return list(found), tokens


def iter_alti_layers(model: nn.Module, tokenizer: Any, text: str, *,
                     truncation: Truncation = "error", max_length: int | None = None,
                     inputs: dict[str, torch.Tensor] | None = None,
                     part_bytes: int | None = None
                     ) -> tuple[Iterator[AltiLayer], tuple[str, ...]]:
    """As :func:`alti_layers`, the decompositions made one layer at a time as they are read
    (each checked when it is made); the forward runs, and the family is checked, at once.
    ``part_bytes``: each layer comes in blocks of query rows whose parts take at most that
    many bytes (at least one row; None: one block per layer), in row order.

    Example:
        >>> found, tokens = iter_alti_layers(lm, lm_tok, prompt)
        >>> [one.layer for one in found]
        [0, 1]
    """
    if model.training:
        raise InputError("ALTI reads the model as it runs; call model.eval() first (dropout)")
    inputs = one_unpadded_input(model, tokenizer, text, inputs, truncation=truncation,
                                max_length=max_length, what="ALTI")
    own = sorted((s for s in hf_sites(model) if s.kind == "self"), key=lambda s: s.layer)
    if not own:
        raise InputError("ALTI: the model has no self-attention to decompose")
    stack_id = min(own, key=lambda s: (s.side != "main", s.layer)).stack
    own = [s for s in own if s.stack == stack_id]
    blocks = _blocks(model, {s.layer: s.path for s in own})
    stores: dict[int, dict[str, torch.Tensor]] = {}
    with ExitStack() as stack:
        for layer, block in blocks.items():
            stores[layer] = {}
            _watch(block, stores[layer], stack)
        cap = stack.enter_context(capture(model, parts=[Keep(), Activations(("v",))],
                                          tokenizer=tokenizer))
        with torch.no_grad():
            model(**inputs)
    if not cap.activations or not cap.activations[0]:
        raise InputError("ALTI: no value vectors were captured")
    # by layer: a capture through hook points names its sites by the pattern hook
    values = {s.layer: kept["v"] for s, kept in cap.activations[0].items()
              if s.kind == "self" and s.stack == stack_id and "v" in kept}
    amap = next(m for m in cap.maps if m.kind == "self" and m.stack == stack_id)
    missing = [s.path for s in own if s.layer not in values]
    if missing:
        raise InputError(f"ALTI: no value vectors were captured at {', '.join(missing)}")
    n = len(amap.key_tokens)

    def made() -> Iterator[AltiLayer]:
        for site in own:
            alpha = amap.pattern[amap.layers.index(site.layer)].to(torch.float64)
            value = values[site.layer][0, :, :n].to("cpu", torch.float64)
            if value.shape[0] != alpha.shape[0]:  # grouped-query attention: shared heads
                value = value.repeat_interleave(alpha.shape[0] // value.shape[0], 0)
            width = stores[site.layer]["x"].shape[-1]
            step = n if part_bytes is None else max(1, part_bytes // (n * width * 8))
            for start in range(0, n, step):
                yield _decompose(site.layer, blocks[site.layer], alpha, value,
                                 stores[site.layer], site.path, slice(start, min(n, start + step)))
    return made(), amap.key_tokens


def alti_matrix(layers: Iterable[AltiLayer]) -> list[torch.Tensor]:
    """The rolled-out ALTI matrices ``R_l`` ``[query, key]``, one per layer (float64, rows
    summing to 1 but for a row with no positive proximity, which stays 0); ``layers`` may be
    the iterator of :func:`iter_alti_layers`.

    Example:
        >>> layers, tokens = alti_layers(lm, lm_tok, prompt)    # a causal LM: 2 layers
        >>> rolled = alti_matrix(layers)
        >>> rolled[-1][-1].shape                        # the last token's row: [key]
        torch.Size([17])
    """
    return list(rollout(layers).values())


def rollout(layers: Iterable[AltiLayer]) -> dict[int, torch.Tensor]:
    """:func:`alti_matrix` keyed by model layer, reading ``layers`` once (so with
    :func:`iter_alti_layers` one block of parts is held at a time).

    Example:
        >>> found, tokens = iter_alti_layers(lm, lm_tok, prompt)
        >>> list(rollout(found))                        # model layers
        [0, 1]
    """
    rolled: dict[int, torch.Tensor] = {}
    blocks: dict[int, list[torch.Tensor]] = {}
    for layer in layers:  # a layer may come in blocks of query rows, in row order
        blocks.setdefault(layer.layer, []).append(contributions(layer.parts, layer.output))
    last: torch.Tensor | None = None
    for index, rows in blocks.items():
        c = torch.cat(rows)
        if c.shape[0] != c.shape[1]:
            raise InputError(f"ALTI: layer {index} came with {c.shape[0]} of {c.shape[1]} rows")
        last = c if last is None else c @ last
        rolled[index] = last
    return rolled


def alti(model: nn.Module, tokenizer: Any, text: str, *, layer: int = -1, query: Query = "auto",
         truncation: Truncation = "error", max_length: int | None = None) -> torch.Tensor:
    """ALTI importance of one text: the ``query`` row of the rollout up to ``layer`` (a model
    layer index; ``-1``: the last).

    Returns:
        ``[key]`` float64, summing to 1 (a row of a product of row-stochastic matrices).

    Raises:
        InputError: an unsupported family, a model in training mode, or a decomposition that
            does not add up to the layer's output.

    Example:
        >>> row = alti(model, tok, texts[0])            # MiniLM: the [CLS] row, last layer
        >>> round(float(row.sum()), 6)
        1.0
    """
    found, _ = iter_alti_layers(model, tokenizer, text, truncation=truncation,
                                max_length=max_length, part_bytes=PART_BYTES)
    rolled = rollout(found)
    held = list(rolled)
    if layer != -1 and layer not in held:
        raise InputError(f"layer {layer} is not a self-attention layer of the model ({held})")
    return read_query(rolled[held[-1] if layer == -1 else layer],
                      resolve_query(query, causal_of(model)))


@VIEWS.register("alti")
class AltiView(View):
    """``alti@L{layer}``: the query row of the ALTI rollout up to that layer (through every
    head, as rollout: the scope picks the layers read, not the heads)."""

    name = "alti"
    summary = ("ALTI (Ferrando et al. 2022): L1 proximity of each token's share of the "
               "attention block's output (values, residual, frozen layer norm), rolled out; "
               "BERT/RoBERTa/ELECTRA/DistilBERT, GPT-2, LLaMA layout")
    needs_model = True

    def check(self, model: nn.Module | None) -> None:
        if model is None:
            raise InputError("the alti view runs the model; none was given")
        if _model_type(model) not in POST_NORM_TYPES:
            _pre_norm(model)

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        found, tokens = iter_alti_layers(inp.model, inp.tokenizer, inp.text,
                                         truncation=inp.truncation, max_length=inp.max_length,
                                         inputs=inp.inputs, part_bytes=PART_BYTES)
        rolled = rollout(found)  # one block of rows' parts held at a time
        return [inp.result(read_query(rolled[layer], inp.query), tokens, f"{self.name}@L{layer}")
                for layer in inp.layers]
