"""Where a model keeps the pieces of its residual stream: the one place that knows it.

Direct logit attribution and the QK/OV circuits need a **pre-norm** model whose residual
stream is a plain sum: ``resid = embed + Σ_layers (attn(norm1(resid)) [+ mlp(norm2(resid))])``,
``logits = final_norm(resid) @ W_U + b_U``. An :class:`Anatomy` names, for such a model, the
module whose input is the embedded residual (the first block), per layer the attention
module, its output projection (whose *input* is the heads' outputs ``z``, head-major), the
pre-attention norm, the per-head weights (:class:`~attnprobe.weights.head_weights.
HeadWeights`) and the MLP, and the embedding, the final norm and the unembedding.

Families are found by **module structure**, not by a list of names; each is an entry of
:data:`ANATOMIES` (a function ``model -> Anatomy | None``):

- ``gpt2``: ``transformer.h[i]`` with ``ln_1``, ``attn.c_attn`` / ``attn.c_proj`` (Conv1D),
  ``ln_2``, ``mlp``; ``ln_f``; ``lm_head``;
- ``llama``: the pre-norm decoders sharing LLaMA's layout (LLaMA, Mistral, Qwen2/3, Gemma,
  OLMo, ...): ``layers[i]`` with ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``,
  ``post_attention_layernorm`` (the MLP's pre-norm) and ``mlp``, the model's ``norm`` and
  ``lm_head``. A layer with more norms (Gemma 2/3, whose outputs are re-normalised before
  they are added) or a residual multiplier (Granite) is refused;
- ``reference``: attnprobe's pre-norm reference models (``blocks[i]`` with ``norm1``/``ln1``,
  ``attn.{q,k,v,out}_proj``, ``norm2``/``ln2`` and ``mlp`` unless attention-only; ``norm`` /
  ``ln_final``; ``embed``; ``unembed``): ``ref:llama``, ``ref:induction``, ``ref:transformer``
  ...

:data:`REFUSALS` names models that cannot be decomposed with one line each: BERT-style
**post-norm** models re-normalise the residual in every layer, so no exact linear
decomposition exists. Whatever the adapter, the analyses check at run time that the parts add
up to the model's own numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from attnprobe.core.registry import Registry
from attnprobe.core.residence import dequantized, loaded
from attnprobe.errors import AttnProbeError, InputError
from attnprobe.weights.head_weights import (
    HeadWeights,
    NormSpec,
    read_norm,
    row_matrix,
    split_in,
    split_out,
)

__all__ = ["ANATOMIES", "REFUSALS", "Anatomy", "DecompositionError", "Layer", "anatomy"]

SUPPORTED = ("GPT-2, pre-norm decoders with LLaMA's layout (LLaMA, Mistral, Qwen2/3, Gemma, "
             "OLMo ...) and attnprobe's pre-norm reference models")


class DecompositionError(AttnProbeError, RuntimeError):
    """The parts of a model's residual stream do not add up to what the model computed."""


@dataclass(frozen=True, eq=False)
class Layer:
    """One pre-norm block: ``resid += out_proj(z)`` with ``z`` the heads' outputs
    ``[batch, seq, head · d_head]`` computed from ``norm(resid)``, then ``resid += mlp(...)``
    (``mlp`` None for attention-only blocks). ``read_weights`` gives the raw
    :class:`HeadWeights`."""

    index: int
    attn: nn.Module
    out_proj: nn.Module
    norm: nn.Module
    mlp: nn.Module | None
    n_heads: int
    n_kv_heads: int
    d_head: int
    read_weights: Callable[[], HeadWeights]

    def weights(self) -> HeadWeights:
        """The layer's raw per-head weights (no norm folded), detached."""
        return self.read_weights()


@dataclass(frozen=True, eq=False)
class Anatomy:
    """Where one model keeps its residual stream pieces (module docstring).

    ``embed`` holds ``W_E`` (``weight [vocab, d_model]``); ``unembed`` maps the final norm's
    output to the logits (None for a model without an LM head); ``rope``: the model rotates
    q and k by position (the weight-based QK circuit ignores it); ``notes``: what else makes a
    weight-based reading approximate.
    """

    family: str
    name: str
    layers: tuple[Layer, ...]
    first_block: nn.Module
    embed: nn.Module
    final_norm: nn.Module
    unembed: nn.Module | None
    d_model: int
    rope: bool = False
    notes: tuple[str, ...] = ()

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        return max(layer.n_heads for layer in self.layers)

    @cached_property
    def final_spec(self) -> NormSpec:
        """The final norm, read by :func:`~attnprobe.weights.head_weights.read_norm`."""
        return read_norm(self.final_norm, self.d_model, "the final norm")

    def norm_spec(self, layer: int) -> NormSpec:
        """Layer ``layer``'s pre-attention norm."""
        return read_norm(self.layers[layer].norm, self.d_model, f"layer {layer}'s norm")

    def embedding(self) -> torch.Tensor:
        """``W_E [vocab, d_model]``, detached."""
        with loaded(self.embed):
            weight = getattr(self.embed, "weight", None)
            if isinstance(weight, torch.Tensor):
                weight = dequantized(weight, self.embed)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
            raise InputError(f"{self.name}: its input embedding has no [vocab, d_model] weight")
        return weight

    def unembedding(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(W_U [d_model, vocab], b_U [vocab] or None)``: ``logits = y @ W_U + b_U``."""
        if self.unembed is None:
            raise InputError(f"{self.name} has no unembedding (language-model head); load it "
                             "with its LM head (e.g. ...ForCausalLM)")
        return row_matrix(self.unembed)


ANATOMIES: Registry[Callable[[nn.Module], Anatomy | None]] = Registry("model anatomy")
"""family -> ``model -> Anatomy`` (None when the model is not of that family)."""
REFUSALS: Registry[Callable[[nn.Module], str | None]] = Registry("anatomy refusal")
"""name -> ``model -> reason`` (None when it does not apply)."""


def anatomy(model: nn.Module) -> Anatomy:
    """The :class:`Anatomy` of ``model`` (the first family of :data:`ANATOMIES` that
    recognises it).

    Raises:
        InputError: the model is refused (:data:`REFUSALS`: one line saying why) or of no
            family attnprobe knows.
    """
    kind = type(model).__name__
    for name in REFUSALS:
        reason = REFUSALS.get(name)(model)
        if reason:
            raise InputError(f"{kind}: {reason}")
    for name in ANATOMIES:
        found = ANATOMIES.get(name)(model)
        if found is not None:
            return found
    raise InputError(f"{kind}: attnprobe does not know where this model keeps its residual "
                     f"stream (embeddings, per-head outputs, MLPs, final norm); supported: "
                     f"{SUPPORTED}")


# ----------------------------------------------------------------------------- helpers
def _name(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(model, "attnprobe_name", None) or getattr(config, "_name_or_path", None)
               or type(model).__name__)


def _has(module: object, *names: str) -> bool:
    return all(isinstance(getattr(module, n, None), nn.Module) for n in names)


def _first(module: nn.Module, *names: str) -> nn.Module | None:
    return next((getattr(module, n) for n in names if _has(module, n)), None)


def _norms(block: nn.Module) -> list[str]:
    """Names of a block's direct children that are norms (by class name)."""
    return [n for n, child in block.named_children() if "norm" in type(child).__name__.lower()]


def _projection_reader(q: nn.Module, k: nn.Module, v: nn.Module, o: nn.Module, n_heads: int,
                       n_kv: int) -> Callable[[], HeadWeights]:
    """Head weights from separate q/k/v/o projections (``nn.Linear`` or ``Conv1D``)."""
    def read() -> HeadWeights:
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = row_matrix(q), row_matrix(k), row_matrix(v)
        W_O, b_O = row_matrix(o)
        return HeadWeights(split_in(W_Q, n_heads), split_in(W_K, n_kv), split_in(W_V, n_kv),
                           split_out(W_O, n_heads), _heads(b_Q, n_heads), _heads(b_K, n_kv),
                           _heads(b_V, n_kv), b_O)
    return read


def _heads(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if bias is None else bias.reshape(n, -1)


def _out_features(module: nn.Module) -> int:
    return int(row_matrix(module)[0].shape[1])


# ----------------------------------------------------------------------------- refusals
@REFUSALS.register("post-norm")
def _post_norm(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    names = (n for n, _ in model.named_modules())
    if getattr(config, "do_layer_norm_before", True) is False or any(
            n.endswith(("attention.output.LayerNorm", "sa_layer_norm")) for n in names):
        return ("a post-norm model (BERT-style): its residual is re-normalised in every layer, "
                "so no exact linear decomposition into heads exists; direct logit attribution "
                "and circuits need a pre-norm model")
    return None


@REFUSALS.register("encoder-decoder")
def _encoder_decoder(model: nn.Module) -> str | None:
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return ("an encoder-decoder model: its decoder's residual also receives cross-attention; "
                "direct logit attribution and circuits need a decoder-only pre-norm model")
    return None


# ----------------------------------------------------------------------------- GPT-2
def _gpt2_blocks(model: nn.Module) -> tuple[nn.Module, nn.ModuleList] | None:
    body = _first(model, "transformer") or model
    blocks = getattr(body, "h", None)
    if not isinstance(blocks, nn.ModuleList) or not len(blocks) or not _has(body, "wte", "ln_f"):
        return None
    if not all(_has(b, "ln_1", "ln_2", "mlp") and _has(getattr(b, "attn", None), "c_attn",
                                                         "c_proj") for b in blocks):
        return None
    return body, blocks


@ANATOMIES.register("gpt2")
def _gpt2(model: nn.Module) -> Anatomy | None:
    found = _gpt2_blocks(model)
    if found is None:
        return None
    body, blocks = found
    if any(_has(b, "crossattention") for b in blocks):
        raise InputError(f"{type(model).__name__}: its blocks add cross-attention to the "
                         "residual; direct logit attribution and circuits need a decoder-only "
                         "model")
    d_model = int(body.wte.weight.shape[1])
    layers = []
    for i, block in enumerate(blocks):
        attn = block.attn
        n_heads = int(attn.num_heads)
        if _out_features(attn.c_attn) != 3 * d_model:
            raise InputError(f"{type(model).__name__}: layer {i}'s c_attn is not three d_model "
                             "projections (q, k, v) as in GPT-2")

        def read(attn: nn.Module = attn, n: int = n_heads) -> HeadWeights:
            W, b = row_matrix(attn.c_attn)  # [d_model, 3 d_model]: q | k | v
            W_O, b_O = row_matrix(attn.c_proj)
            Ws = W.split(d_model, dim=1)
            bs = (None,) * 3 if b is None else b.split(d_model)
            return HeadWeights(*(split_in(m, n) for m in Ws), split_out(W_O, n),
                               *(_heads(x, n) for x in bs), b_O)
        layers.append(Layer(i, attn, attn.c_proj, block.ln_1, block.mlp, n_heads, n_heads,
                            d_model // n_heads, read))
    get = getattr(model, "get_output_embeddings", None)
    unembed = get() if callable(get) else None
    return Anatomy("gpt2", _name(model), tuple(layers), blocks[0], body.wte, body.ln_f,
                   unembed, d_model, rope=False)


# ----------------------------------------------------------------------------- LLaMA layout
_LLAMA_NORMS = {"input_layernorm", "post_attention_layernorm"}


def _llama_layer(layer: nn.Module) -> bool:
    return _has(layer, "input_layernorm", "post_attention_layernorm", "mlp") and _has(
        getattr(layer, "self_attn", None), "q_proj", "k_proj", "v_proj", "o_proj")


def _llama_body(model: nn.Module) -> nn.Module | None:
    for body in (model, *(m for _, m in model.named_modules())):
        layers = getattr(body, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and _has(body, "norm") \
                and all(_llama_layer(layer) for layer in layers):
            return body
    return None


@ANATOMIES.register("llama")
def _llama(model: nn.Module) -> Anatomy | None:
    body = _llama_body(model)
    if body is None:
        return None
    kind = type(model).__name__
    config = getattr(model, "config", None)
    if getattr(config, "residual_multiplier", 1.0) not in (None, 1, 1.0):
        raise InputError(f"{kind}: each layer's output is scaled (residual_multiplier) before "
                         "it is added; direct logit attribution and circuits do not model that")
    get_input = getattr(model, "get_input_embeddings", None)
    embed = get_input() if callable(get_input) else None
    embed = embed if embed is not None else _first(body, "embed_tokens")
    if embed is None:
        return None
    d_model = int(embed.weight.shape[1])
    layers, notes = [], []
    for i, layer in enumerate(body.layers):
        extra = sorted(set(_norms(layer)) - _LLAMA_NORMS)
        if extra:
            raise InputError(f"{kind}: layer {i} has more norms ({', '.join(extra)}) than "
                             "LLaMA's two: its attention or MLP output is re-normalised before "
                             "it is added, so no exact linear decomposition into heads exists")
        attn = layer.self_attn
        d_head = int(getattr(attn, "head_dim", 0) or d_model // config.num_attention_heads)
        n_heads = _out_features(attn.q_proj) // d_head
        n_kv = _out_features(attn.k_proj) // d_head
        if row_matrix(attn.o_proj)[0].shape[0] != n_heads * d_head:
            raise InputError(f"{kind}: layer {i}'s o_proj does not read the {n_heads} heads' "
                             "outputs (gated or latent attention); not supported")
        if _has(attn, "q_norm") or _has(attn, "k_norm"):
            notes.append("q/k are normalised per head (q_norm/k_norm): the weight-based QK "
                         "circuit ignores it")
        layers.append(Layer(i, attn, attn.o_proj, layer.input_layernorm, layer.mlp, n_heads,
                            n_kv, d_head, _projection_reader(attn.q_proj, attn.k_proj,
                                                             attn.v_proj, attn.o_proj,
                                                             n_heads, n_kv)))
    get = getattr(model, "get_output_embeddings", None)
    unembed = get() if callable(get) and model is not body else None
    return Anatomy("llama", _name(model), tuple(layers), body.layers[0], embed, body.norm,
                   unembed, d_model, rope=True, notes=tuple(dict.fromkeys(notes)))


# ----------------------------------------------------------------------------- reference
def _reference_block(block: nn.Module) -> bool:
    attn = getattr(block, "attn", None)
    return _first(block, "norm1", "ln1") is not None and _has(
        attn, "q_proj", "k_proj", "v_proj", "out_proj") and all(
        isinstance(getattr(attn, n, None), int) for n in ("n_heads", "n_kv_heads", "d_head"))


@ANATOMIES.register("reference")
def _reference(model: nn.Module) -> Anatomy | None:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not len(blocks) \
            or not all(_reference_block(b) for b in blocks) or not _has(model, "embed"):
        return None
    final = _first(model, "norm", "ln_final")
    if final is None:
        return None
    d_model = int(model.embed.weight.shape[1])
    layers, notes, rope = [], [], False
    for i, block in enumerate(blocks):
        attn = block.attn
        rope = rope or bool(getattr(attn, "rope", False))
        if getattr(attn, "slopes", None) is not None:
            notes.append("ALiBi adds a distance bias to the scores that the weights do not hold")
        layers.append(Layer(i, attn, attn.out_proj, _first(block, "norm1", "ln1"),
                            _first(block, "mlp"), attn.n_heads, attn.n_kv_heads, attn.d_head,
                            _projection_reader(attn.q_proj, attn.k_proj, attn.v_proj,
                                               attn.out_proj, attn.n_heads, attn.n_kv_heads)))
    return Anatomy("reference", _name(model), tuple(layers), blocks[0], model.embed, final,
                   _first(model, "unembed"), d_model, rope=rope,
                   notes=tuple(dict.fromkeys(notes)))
