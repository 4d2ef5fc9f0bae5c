"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi 2023): how much each token's value
vector shapes every token's output of one layer.

For layer ``l`` and token ``j``, the value vector of ``j`` is set to zero in the layer's
attention (every head, or one head with ``per="head"``; the attention weights stay as computed),
the layer is recomputed (attention, residual, norms, MLP) and ``C_l[i, j]`` is the cosine
distance between token ``i``'s original and altered layer output; each row is normalised to
sum 1. Across layers the paper rolls the matrices out without a residual term (the layer
output already holds it): ``C̃_0 = C_0``, ``C̃_l = C_l · C̃_{l-1}``.

Only the zeroed layer is recomputed: one plain forward records every block's inputs (a
forward pre-hook) and output; then each layer's block runs on a batch of copies of its input,
copy ``r`` with one token's value row zeroed by a forward hook on the value projection, as many
copies per forward as :data:`ROW_BUDGET` allows. Supported: the model types of
:data:`VALUE_FAMILIES` (BERT-like post-norm encoders incl. ELECTRA and DistilBERT, GPT-2,
LLaMA / Mistral / Qwen2); one unpadded text at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from attnprobe.attribution.model_views import NORM_FAMILIES
from attnprobe.attribution.view_base import VIEWS, View, ViewInput
from attnprobe.attribution.view_common import one_unpadded_input, read_query
from attnprobe.capture.discovery import hf_sites
from attnprobe.capture.sites import Site
from attnprobe.errors import InputError
from attnprobe.inputs.text import Truncation
from attnprobe.types import TokenAttribution

__all__ = ["ROW_BUDGET", "VALUE_FAMILIES", "VALUE_SLOTS", "ValueSlot", "ValueZeroingScores",
           "ValueZeroingView", "value_zeroing", "zeroing_rollout"]

Per = Literal["layer", "head"]
Aggregate = Literal["rollout", "layer"]

ROW_BUDGET = 2 ** 27
"""Elements (about 512 MiB in float32) that one recompute of a layer may hold for its batch of
zeroed copies; a copy of ``seq`` tokens costs about ``seq · (8·d_model + heads·seq)``."""


@dataclass(frozen=True)
class ValueSlot:
    """Where a family's value vectors are: the projection under the attention module, and
    which of its ``parts`` equal column blocks holds the values (GPT-2 fuses q, k, v)."""

    path: str
    block: int = 0
    parts: int = 1


VALUE_SLOTS: dict[str, ValueSlot] = {
    "bert": ValueSlot("value"),
    "gpt2": ValueSlot("c_attn", block=2, parts=3),
    "llama": ValueSlot("v_proj"),
    "distilbert": ValueSlot("v_lin"),
}
"""Family (of :data:`VALUE_FAMILIES`) -> its value projection."""

VALUE_FAMILIES: dict[str, str] = {**NORM_FAMILIES, "electra": "bert", "distilbert": "distilbert"}
"""``config.model_type`` -> family of :data:`VALUE_SLOTS`: the norm view's families, and the
post-norm encoders whose value projection is known although their output projection is not
sliced by the norm view."""


@dataclass(frozen=True)
class ValueZeroingScores:
    """Value-zeroing matrices of one text.

    Attributes:
        scores: ``[layer, query, key]`` (``per="layer"``) or ``[layer, head, query, key]``
            (``per="head"``) float64; every row sums to 1; ``[..., i, j]`` is the share of
            token ``j``'s value in token ``i``'s output of the layer.
        layers: the model layers of the first axis.
        tokens: the text's tokens.
        per: ``"layer"`` (every head zeroed at once) or ``"head"``.
    """

    scores: torch.Tensor
    layers: tuple[int, ...]
    tokens: tuple[str, ...]
    per: Per


def check_family(model: nn.Module) -> str:
    """The family of ``model`` (refused when its value projection is not known)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in VALUE_FAMILIES:
        raise InputError(f"value zeroing hooks the value projection of model types "
                         f"{', '.join(sorted(VALUE_FAMILIES))} only; got "
                         f"{model_type or type(model).__name__}, whose value projection it "
                         "does not know")
    return VALUE_FAMILIES[model_type]


def main_sites(model: nn.Module) -> list[Site]:
    """Self-attention sites of the first stack, by layer."""
    own = [s for s in hf_sites(model) if s.kind == "self"]
    if not own:
        raise InputError("the model has no self-attention site to zero values in")
    stack = min(own, key=lambda s: (s.side != "main", s.layer)).stack
    return sorted((s for s in own if s.stack == stack), key=lambda s: s.layer)


def head_counts(model: nn.Module) -> tuple[int, int]:
    """``(attention heads, value heads)`` from the config (value heads differ under GQA)."""
    config = model.config
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0))
    kv = getattr(config, "num_key_value_heads", None)
    return heads, int(kv) if kv else heads


def zeroing_rollout(scores: torch.Tensor) -> torch.Tensor:
    """Rollout without a residual term, as the paper: ``[layer, query, key]`` ->
    ``[layer, query, key]`` with ``out[0] = C_0`` and ``out[l] = C_l · out[l-1]`` (the layer
    output already carries the residual, so no identity is added).

    Example:
        >>> c = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.5, 0.5], [0.0, 1.0]]])
        >>> zeroing_rollout(c)[1]                       # C_1 · C_0
        tensor([[0.7500, 0.2500],
                [0.5000, 0.5000]])
    """
    out = torch.empty_like(scores)
    out[0] = scores[0]
    for layer in range(1, scores.shape[0]):
        out[layer] = scores[layer] @ out[layer - 1]
    return out


# ----------------------------------------------------------------------------- the recompute
@dataclass
class BlockCall:
    """One block's recorded call: its positional and keyword inputs, and its output hidden
    states ``[1, seq, d_model]``."""

    args: tuple
    kwargs: dict[str, Any]
    output: torch.Tensor | None = None


def hidden_of(output: Any) -> torch.Tensor:
    """A block's hidden states, whether it returns a tensor or a tuple led by one."""
    return output if isinstance(output, torch.Tensor) else output[0]


def scrubbed(value: Any) -> Any:
    """A recorded input without its cache object (a rerun must not extend it)."""
    return None if type(value).__name__.endswith("Cache") else value


def expanded(value: Any, rows: int) -> Any:
    """``value`` with each batch-of-one tensor (``ndim >= 2``) repeated to ``rows`` copies;
    nested tuples and lists alike. The copies are materialised: a block may write into its
    input in place, which an expanded view would refuse."""
    if isinstance(value, torch.Tensor):
        return value.expand(rows, *value.shape[1:]).contiguous() if value.ndim >= 2 and \
            value.shape[0] == 1 else value
    if isinstance(value, (tuple, list)):
        return type(value)(expanded(v, rows) for v in value)
    return value


def record_blocks(model: nn.Module, blocks: dict[int, nn.Module],
                  inputs: dict[str, torch.Tensor]) -> dict[int, BlockCall]:
    """One plain forward recording every block's call (inputs and output)."""
    calls: dict[int, BlockCall] = {}
    handles = []

    def pre(layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            calls[layer] = BlockCall(tuple(scrubbed(a) for a in args),
                                     {k: scrubbed(v) for k, v in kwargs.items()})
        return hook

    def post(layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            calls[layer].output = hidden_of(output).detach()
        return hook

    try:
        for layer, block in blocks.items():
            handles.append(block.register_forward_pre_hook(pre(layer), with_kwargs=True))
            handles.append(block.register_forward_hook(post(layer)))
        extra = {"use_cache": False} if getattr(model.config, "use_cache", False) else {}
        with torch.no_grad():
            model(**inputs, **extra)
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(set(blocks) - {k for k, c in calls.items() if c.output is not None})
    if missing:
        raise InputError(f"layers {missing} did not run during the forward")
    return calls


@contextmanager
def zeroing(projection: nn.Module, keep: torch.Tensor) -> Iterator[None]:
    """Multiply the projection's output ``[rows, seq, out]`` by ``keep`` (same shape; 0 where a
    value entry is zeroed) while the context is open."""
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output * keep.to(output.dtype)

    handle = projection.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def cosine_distance(original: torch.Tensor, altered: torch.Tensor) -> torch.Tensor:
    """``1 − cos`` per token: ``[seq, d]`` against ``[rows, seq, d]`` -> ``[rows, seq]``
    float64."""
    a = original.to(torch.float64)[None]
    b = altered.to(torch.float64)
    return 1 - torch.nn.functional.cosine_similarity(a, b, dim=-1)


def rows_per_forward(seq: int, width: int, heads: int, batch_size: int | None) -> int:
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive int; got {batch_size!r}")
        return batch_size
    return max(1, ROW_BUDGET // (seq * (8 * width + heads * seq)))


def zero_layer(block: nn.Module, projection: nn.Module, call: BlockCall,
               spans: Sequence[tuple[int, int]], chunk: int) -> torch.Tensor:
    """``[span, query, key]`` cosine distances: span ``s`` of the value columns zeroed for
    each key token in turn, every (span, key) a copy in a batch of ``chunk`` copies."""
    seq = call.output.shape[1]
    jobs = [(s, j) for s in range(len(spans)) for j in range(seq)]
    out = torch.zeros(len(spans), seq, seq, dtype=torch.float64)
    width = projection.weight.shape[0] if isinstance(projection, nn.Linear) \
        else projection.weight.shape[1]  # GPT-2's Conv1D stores [in, out]
    for start in range(0, len(jobs), chunk):
        batch = jobs[start:start + chunk]
        keep = torch.ones(len(batch), seq, width, device=call.output.device)
        for row, (s, j) in enumerate(batch):
            keep[row, j, spans[s][0]:spans[s][1]] = 0
        with torch.no_grad(), zeroing(projection, keep):
            altered = hidden_of(block(*expanded(call.args, len(batch)),
                                      **expanded(call.kwargs, len(batch))))
        distances = cosine_distance(call.output[0], altered).cpu()  # [rows, query]
        for row, (s, j) in enumerate(batch):
            out[s, :, j] = distances[row]
    return out.clamp(min=0)  # rounding can leave −1e-16 where zeroing changes nothing


def normalised(scores: torch.Tensor, layer: int) -> torch.Tensor:
    sums = scores.sum(-1, keepdim=True)
    if (sums <= 0).any():
        row = int((sums[..., 0] <= 0).nonzero()[0][-1])
        raise InputError(f"value zeroing in layer {layer} changes no value of query row {row} "
                         "(the row cannot be normalised)")
    return scores / sums


def value_zeroing(model: nn.Module, tokenizer: Any, text: str, *,
                  layers: Sequence[int] | None = None, per: Per = "layer",
                  heads: Sequence[int] | None = None, batch_size: int | None = None,
                  truncation: Truncation = "error", max_length: int | None = None,
                  inputs: dict[str, torch.Tensor] | None = None) -> ValueZeroingScores:
    """Value-zeroing matrices of one text, per layer (module docstring).

    Args:
        text: one input text (``inputs``, ``[1, seq]`` ids and mask, replace it when given).
        layers: model layers (default every layer).
        per: ``"layer"``: every head's value of token ``j`` zeroed at once (the paper);
            ``"head"``: one head at a time (refused for grouped-query attention, where heads
            share values).
        heads: with ``per="head"``, the heads zeroed (default every head).
        batch_size: zeroed copies per recompute of a layer (default: as many as
            :data:`ROW_BUDGET` allows).
        truncation, max_length: for a text longer than the model allows.

    Returns:
        :class:`ValueZeroingScores`: ``[layer, query, key]`` (or ``[layer, head, query, key]``)
        float64, rows summing to 1.

    Raises:
        InputError: an unsupported family, a model in training mode, padded or batched
            ``inputs``, a row that zeroing leaves unchanged.

    Example:
        >>> found = value_zeroing(model, tok, texts[0], layers=[0, 5])   # MiniLM: BERT
        >>> found.scores.shape                          # [layer, query, key]
        torch.Size([2, 9, 9])
        >>> torch.allclose(found.scores.sum(-1), torch.ones(2, 9, dtype=torch.float64))
        True
        >>> value_zeroing(model, tok, texts[0], layers=[0], per="head").scores.shape
        torch.Size([1, 12, 9, 9])
    """
    family = check_family(model)
    if model.training:
        raise InputError("value zeroing compares two forwards: call model.eval() first "
                         "(dropout would change the output)")
    if per not in ("layer", "head"):
        raise InputError(f"per must be 'layer' or 'head'; got {per!r}")
    n_heads, n_values = head_counts(model)
    if per == "head" and n_values != n_heads:
        raise InputError(f"per='head' zeroes one head's value, but this model's {n_heads} "
                         f"heads share {n_values} value heads (grouped-query attention); "
                         "use per='layer'")
    inputs = one_unpadded_input(model, tokenizer, text, inputs, truncation=truncation,
                                max_length=max_length, what="value zeroing")
    sites = {s.layer: s for s in main_sites(model)}
    layers = sorted(sites) if layers is None else list(layers)
    unknown = [layer for layer in layers if layer not in sites]
    if not layers or unknown:
        raise InputError(f"layers {unknown or layers} not among the model's {sorted(sites)}")
    slot = VALUE_SLOTS[family]
    blocks = {layer: model.get_submodule(f"{sites[layer].stack}.{layer}") for layer in layers}
    calls = record_blocks(model, blocks, inputs)
    chosen = list(range(n_heads)) if heads is None else list(heads)
    if per == "head" and (not chosen or any(not 0 <= h < n_heads for h in chosen)):
        raise InputError(f"heads {heads!r} out of range (0..{n_heads - 1})")
    matrices = []
    for layer in layers:
        projection = model.get_submodule(f"{sites[layer].path}.{slot.path}")
        total = projection.weight.shape[0] if isinstance(projection, nn.Linear) \
            else projection.weight.shape[1]
        width = total // slot.parts
        lo = slot.block * width
        d_head = width // n_values
        spans = [(lo, lo + width)] if per == "layer" else \
            [(lo + h * d_head, lo + (h + 1) * d_head) for h in chosen]
        seq = calls[layer].output.shape[1]
        chunk = rows_per_forward(seq, calls[layer].output.shape[-1], n_heads, batch_size)
        scores = normalised(zero_layer(blocks[layer], projection, calls[layer], spans, chunk),
                            layer)
        matrices.append(scores[0] if per == "layer" else scores)
    ids = inputs["input_ids"][0].tolist()
    tokens = tuple(tokenizer.convert_ids_to_tokens(ids)) \
        if hasattr(tokenizer, "convert_ids_to_tokens") else tuple(str(i) for i in ids)
    return ValueZeroingScores(torch.stack(matrices), tuple(layers), tokens, per)


# ----------------------------------------------------------------------------- the view
@VIEWS.register("value_zeroing")
@dataclass(eq=False)  # hashed by identity, as every other view
class ValueZeroingView(View):
    """``value_zeroing@L{layer}``: the query row of the value-zeroing rollout after each layer
    (``aggregate="layer"``: of the layer's own matrix; ``per="head"``: the mean over the
    scope's heads of each head's matrix, never rolled out)."""

    per: Per = "layer"
    aggregate: Aggregate | None = None
    batch_size: int | None = None

    name: ClassVar[str] = "value_zeroing"
    summary: ClassVar[str] = ("value zeroing (Mohebbi et al. 2023): cosine distance of each "
                              "layer output when a token's value is zeroed, rolled out; "
                              "BERT/RoBERTa/ELECTRA/DistilBERT, GPT-2, "
                              "LLaMA/Mistral/Qwen2")
    needs_model: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.per not in ("layer", "head"):
            raise InputError(f"per must be 'layer' or 'head'; got {self.per!r}")
        if self.aggregate is None:
            self.aggregate = "rollout" if self.per == "layer" else "layer"
        if self.aggregate not in ("rollout", "layer"):
            raise InputError(f"aggregate must be 'rollout' or 'layer'; got {self.aggregate!r}")
        if self.per == "head" and self.aggregate == "rollout":
            raise InputError("per='head' matrices are not rolled out (the next layer reads "
                             "every head's mix); use aggregate='layer'")

    def check(self, model: nn.Module | None) -> None:
        check_family(model)

    def importance(self, inp: ViewInput) -> list[TokenAttribution]:
        wanted = inp.layers
        layers = list(range(max(wanted) + 1)) if self.aggregate == "rollout" else list(wanted)
        found = value_zeroing(inp.model, inp.tokenizer, inp.text, layers=layers, per=self.per,
                              batch_size=self.batch_size, truncation=inp.truncation,
                              max_length=inp.max_length, inputs=inp.inputs)
        scores = zeroing_rollout(found.scores) if self.aggregate == "rollout" else found.scores
        results = []
        for layer in wanted:
            matrix = scores[found.layers.index(layer)]
            if self.per == "head":
                chosen = inp.heads(layer)
                matrix = matrix.mean(0) if chosen is None else matrix[list(chosen)].mean(0)
            results.append(inp.result(read_query(matrix, inp.query), found.tokens,
                                      f"{self.name}@L{layer}"))
        return results
