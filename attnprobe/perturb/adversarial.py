"""Adversarial attention (Jain & Wallace 2019, §4.3), transferred to transformer heads.

For one example, learn ``K`` attention distributions for the scoped heads of one layer that
are as far as possible (Jensen-Shannon) from the model's own weights ``α̂`` and from each
other, while the output moves by at most ``ε`` (total variation). If such distributions
exist, the original weights are not the only ones that "explain" the prediction.

The learned object is a set of logits ``θ[k, head, query, key]`` per adversary; the weights
are ``α_k = softmax(θ_k)`` over the keys the model itself could attend to (padding and
causally masked keys keep weight 0). They replace the scoped heads' rows between the softmax
and the values through :func:`attnprobe.capture` (``edit=``); everything else — the other
heads, the values, the other layers — is computed by the model as usual. The ``K``
adversaries run as one batch of ``K`` copies of the example.

Loss (minimised with Adam, J&W's ``AdversaryMulti``)::

    - mean_k JSD(α_k, α̂) + 500 · mean_k ReLU(TVD(ŷ_k, ŷ) - ε) - mean_{k≠l} JSD(α_k, α_l)

JSD uses natural logs (bounded by ln 2 ≈ 0.693) and is averaged over the scoped heads and
the query rows that have at least two keys to choose from; ``TVD(p, q) = ½ Σ_c |p_c - q_c|``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture import Edit, capture
from attnprobe.core import divergence
from attnprobe.core.display import counted, describe, indices
from attnprobe.core.residence import input_device
from attnprobe.errors import InputError
from attnprobe.types import head_id

__all__ = ["ADVERSARIAL_COLUMNS", "AdversarialResult", "adversarial_attention"]

ADVERSARIAL_COLUMNS = ("layer", "heads", "adversary", "jsd", "tvd", "eps", "within_eps")
PENALTY = 500.0  # J&W's weight on the output-change hinge
_TINY = 1e-10  # J&W's smoothing inside the logs (keeps gradients finite at zero weights)
_PROB_TOL = 1e-3

OutputFn = Callable[[Any], torch.Tensor]


@dataclass(frozen=True, eq=False)
class AdversarialResult:
    """What :func:`adversarial_attention` found for one example.

    Attributes:
        layer / heads: the scoped attention (model indices).
        eps: the output budget ε (TVD).
        jsd: per adversary, the mean JSD (nats) of its weights from the original weights,
            over the scoped heads and the query rows with at least two allowed keys.
        tvd: per adversary, the output change ``TVD(ŷ_k, ŷ)``.
        max_jsd_within_eps: the largest ``jsd`` among adversaries with ``tvd <= eps``, or
            ``None`` when no adversary kept the output within ε (see ``note``); never NaN.
        attention: ``[adversary, head, query, key]`` the adversarial weights of the scoped
            heads (query rows the adversary could not change hold the original weights).
        original: ``[head, query, key]`` the model's own weights of the scoped heads.
        note: one line saying how the ε filter came out.
    """

    layer: int
    heads: tuple[int, ...]
    eps: float
    jsd: tuple[float, ...]
    tvd: tuple[float, ...]
    max_jsd_within_eps: float | None
    attention: torch.Tensor = field(repr=False)
    original: torch.Tensor = field(repr=False)
    note: str = ""

    def __repr__(self) -> str:
        best = self.max_jsd_within_eps
        return describe("AdversarialResult", f"layer {self.layer} heads {indices(self.heads)}",
                        f"eps {self.eps:g}", counted(len(self.jsd), "adversary", "adversaries"),
                        f"{self.n_within_eps} within eps",
                        "no max JSD" if best is None else f"max JSD {best:.3g} nats")

    @property
    def n_within_eps(self) -> int:
        """How many adversaries kept the output within ε."""
        return sum(t <= self.eps for t in self.tvd)

    def to_frame(self) -> pd.DataFrame:
        """One row per adversary; columns ``ADVERSARIAL_COLUMNS`` (``heads`` as ``L0H1,L0H3``)."""
        heads = ",".join(head_id(self.layer, h) for h in self.heads)
        rows = [(self.layer, heads, k, j, t, self.eps, t <= self.eps)
                for k, (j, t) in enumerate(zip(self.jsd, self.tvd, strict=True))]
        return pd.DataFrame(rows, columns=list(ADVERSARIAL_COLUMNS))


# ----------------------------------------------------------------------------- checks
def _index(value: Any) -> int:
    """An integer index (numpy integers too); TypeError for anything else, bools included."""
    if isinstance(value, bool):
        raise TypeError
    return operator.index(value)


def _check_args(layer: Any, heads: Any, eps: Any, n_adversaries: Any, steps: Any,
                lr: Any) -> tuple[int, tuple[int, ...]]:
    def integer(name: str, value: Any, low: int) -> int:
        try:
            value = _index(value)
        except TypeError:
            raise InputError(f"{name} must be an integer >= {low}; got {value!r}") from None
        if value < low:
            raise InputError(f"{name} must be an integer >= {low}; got {value!r}")
        return value

    layer = integer("layer", layer, 0)
    integer("n_adversaries", n_adversaries, 1)
    integer("steps", steps, 1)
    if isinstance(heads, (str, bytes)):
        raise InputError(f"heads must be a sequence of head indices; got {heads!r}")
    items = list(heads) if isinstance(heads, Iterable) else [heads]
    if not items:
        raise InputError("heads must not be empty: name the heads to replace")
    heads = tuple(integer("every head", h, 0) for h in items)
    if len(set(heads)) != len(heads):
        raise InputError(f"heads must not repeat; got {list(heads)}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) \
            or eps <= 0:
        raise InputError(f"eps (the TVD budget) must be a finite number > 0; got {eps!r}")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) \
            or lr <= 0:
        raise InputError(f"lr must be a finite number > 0; got {lr!r}")
    return layer, heads


def _one_example(inputs: Any) -> int:
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError("inputs must be a dict of model inputs, e.g. {'input_ids': ..., "
                         "'attention_mask': ...}")
    sizes = {v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor) and v.ndim}
    if sizes != {1}:
        raise InputError(f"adversarial_attention takes one example (batch size 1); the "
                         f"inputs have batch sizes {sorted(sizes)}")
    return 1


def repeat_inputs(inputs: Mapping[str, Any], k: int) -> dict[str, Any]:
    """``k`` copies of a one-example batch (non-tensor entries passed through)."""
    return {name: value.expand(k, *value.shape[1:]).contiguous()
            if isinstance(value, torch.Tensor) and value.ndim else value
            for name, value in inputs.items()}


def _probabilities(output_fn: OutputFn, output: Any, batch: int) -> torch.Tensor:
    probs = output_fn(output)
    if not isinstance(probs, torch.Tensor) or probs.ndim != 2 or probs.shape[0] != batch:
        got = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise InputError(f"output_fn must return probabilities [batch={batch}, classes]; "
                         f"got {got}")
    detached = probs.detach()
    if not torch.isfinite(detached).all() or (detached < -_PROB_TOL).any() \
            or ((detached.sum(-1) - 1).abs() > _PROB_TOL).any():
        raise InputError("output_fn must return probabilities (non-negative, rows summing "
                         "to 1), e.g. logits.softmax(-1); got values that are not")
    return probs


# ----------------------------------------------------------------------------- main
def adversarial_attention(model: nn.Module, inputs: Mapping[str, Any], *, layer: int,
                          heads: Sequence[int], output_fn: OutputFn, eps: float,
                          n_adversaries: int = 5, steps: int = 500, lr: float = 0.01,
                          seed: int = 0) -> AdversarialResult:
    """Jain & Wallace's adversarial attention on the scoped heads of one layer.

    Args:
        model: any model :func:`attnprobe.capture` can edit (reference models, transformers
            models, modules with ``hook_pattern`` paths) with a single attention stack.
        inputs: the model's keyword inputs for **one** example (batch size 1), e.g. the
            output of a tokenizer; ``attention_mask`` (if given) marks the real tokens.
        layer / heads: the attention that is replaced (model indices).
        output_fn: ``output_fn(model_output) -> probabilities [batch, classes]``, e.g.
            ``lambda out: out.softmax(-1)`` for a classifier or a readout of an embedding.
        eps: output budget ε: an adversary counts if ``TVD(ŷ_k, ŷ) <= eps`` (J&W use 0.01
            for classification, 0.05 for QA).
        n_adversaries: ``K`` (J&W: 5), optimised together as one batch.
        steps / lr: Adam steps and learning rate (J&W: 500, 0.01).
        seed: seeds the initial logits ``log(1/n) + 3·N(0, 1)`` (global RNG untouched).

    Returns:
        :class:`AdversarialResult`. Each adversary reports the iterate with the largest JSD
        whose TVD stayed within ε; one that never did reports its last iterate (and then
        counts as outside ε). J&W keep the last iterate and filter with a looser 0.05; keeping
        the best feasible iterate makes the ε filter meaningful with one tolerance.

    Raises:
        InputError: ``eps <= 0``, ``layer``/``heads`` out of range, a batch of several
            examples, an ``output_fn`` that does not return probabilities, a layer present
            in several attention stacks, no query row with two keys to choose from, or a
            call inside ``torch.inference_mode()``.

    The model's parameters and mode are left as they are (gradients are taken with
    ``torch.autograd.grad`` with respect to the logits only).

    Example:
        >>> ids = lm_tok([prompt], return_tensors="pt")  # one example
        >>> found = adversarial_attention(
        ...     lm, ids, layer=1, heads=[0], eps=0.05, n_adversaries=3, steps=20,
        ...     output_fn=lambda logits: logits[:, -1].softmax(-1))   # next-token [1, vocab]
        >>> found.attention.shape                       # [adversary, head, query, key]
        torch.Size([3, 1, 17, 17])
        >>> torch.allclose(found.attention.sum(-1), torch.ones(3, 1, 17))   # still weights
        True
        >>> found.max_jsd_within_eps                    # how far attention moved within ε
    """
    layer, heads = _check_args(layer, heads, eps, n_adversaries, steps, lr)
    _one_example(inputs)
    if torch.is_inference_mode_enabled():
        raise InputError("adversarial_attention needs gradients; call it outside "
                         "torch.inference_mode()")
    eps = float(eps)
    clean = _clean_forward(model, inputs, layer, heads, output_fn)
    adversaries = _Adversaries(clean, n_adversaries, seed, _device(model, clean.probs), lr)
    best = _train(model, repeat_inputs(inputs, n_adversaries), layer, clean, adversaries,
                  output_fn, eps, steps)
    return _result(layer, heads, eps, best, clean)


# ----------------------------------------------------------------------------- steps
@dataclass(frozen=True)
class _Clean:
    """The unperturbed forward: the output's probabilities ``[1, classes]``, the scoped
    heads' weights ``[head, query, key]`` (float32 CPU), the keys each row may choose from
    and the rows an adversary can change (``[head, query]``: a real query with two keys)."""

    probs: torch.Tensor
    group: Any  # the layer's BatchPatterns (validity masks, for cropping the results)
    heads: tuple[int, ...]
    original: torch.Tensor
    allowed: torch.Tensor
    free: torch.Tensor


def _clean_forward(model: nn.Module, inputs: Mapping[str, Any], layer: int,
                   heads: tuple[int, ...], output_fn: OutputFn) -> _Clean:
    """The original weights and output, and which rows and keys the adversaries may use."""
    with torch.no_grad(), capture(model, layers=[layer]) as cap:
        output = model(**inputs)
    groups = cap.batches()
    if len(groups) != 1:
        paths = ", ".join(s.path for s in cap.sites)
        raise InputError(f"layer {layer} is in several attention stacks ({paths}); "
                         "adversarial_attention needs a model with one attention stack")
    group = groups[0]
    n_heads = group.pattern.shape[2]
    bad = [h for h in heads if h >= n_heads]
    if bad:
        raise InputError(f"heads {bad} out of range: layer {layer} has {n_heads} heads "
                         f"(0..{n_heads - 1})")
    probs = _probabilities(output_fn, output, 1).detach()
    original = group.pattern[0, 0, list(heads)]  # [head, query, key]
    allowed = (original > 0) & group.key_valid[0][None, None, :]  # [head, query, key]
    free = (allowed.sum(-1) >= 2) & group.query_valid[0][None, :]  # [head, query]
    if not free.any():
        raise InputError(f"no real query row of layer {layer} heads {list(heads)} has two "
                         "keys to choose from; the attention cannot be changed")
    return _Clean(probs, group, heads, original, allowed, free)


class _Adversaries:
    """``K`` adversaries: logits ``θ [K, head, query, key]`` (initialised at
    ``log(1/n) + 3·N(0, 1)`` from ``seed``), their Adam optimiser, and the capture edit that
    puts their weights into the scoped heads of the batch's ``K`` copies."""

    def __init__(self, clean: _Clean, k: int, seed: int, device: torch.device,
                 lr: float) -> None:
        self.k = k
        self.original = clean.original.to(device)
        self.free = clean.free.to(device)
        # rows with no allowed key (padding queries) get a dummy full row; they are never used
        self.allowed = (clean.allowed | ~clean.allowed.any(-1, keepdim=True)).to(device)
        self.n_free = self.free.sum()
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn((k, *clean.original.shape), generator=generator)
        log_uniform = -torch.log(clean.allowed.sum(-1, keepdim=True).clamp(min=1).float())
        self.theta = (log_uniform + 3.0 * noise).to(device).requires_grad_(True)
        self.optimizer = torch.optim.Adam([self.theta], lr=lr)
        self.head_index = torch.tensor(list(clean.heads), device=device)
        # the weights the next forward's edit puts in (set by each step's weights())
        self.current = self.original.expand(k, *self.original.shape)

    def weights(self) -> torch.Tensor:
        """``[K, head, query, key]``: softmax over the allowed keys on the free rows, the
        original weights elsewhere; also what the next forward's edit puts in."""
        masked = self.theta.masked_fill(~self.allowed, float("-inf"))
        adv = torch.softmax(masked, dim=-1)
        self.current = torch.where(self.free[..., None], adv, self.original)
        return self.current

    def edit(self, _layer: int, pattern: torch.Tensor) -> torch.Tensor:
        return pattern.index_copy(1, self.head_index, self.current.to(pattern.dtype))

    def mean_rows(self, values: torch.Tensor) -> torch.Tensor:
        """``[..., head, query] -> [...]``: the mean over the free rows."""
        return (values * self.free).sum((-2, -1)) / self.n_free

    def loss(self, adv: torch.Tensor, tvd: torch.Tensor, eps: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """J&W's loss (module docstring) and each adversary's JSD from the original ``[K]``."""
        jsd = self.mean_rows(divergence.jsd(adv, self.original, eps=_TINY))  # [K]
        loss = -jsd.mean() + PENALTY * torch.relu(tvd - eps).mean()
        if self.k > 1:
            cross = self.mean_rows(divergence.jsd(adv[:, None], adv[None, :], eps=_TINY))
            loss = loss - cross.sum() / (self.k * (self.k - 1))  # [K, K] summed off-diagonal
        return loss, jsd

    def step(self, loss: torch.Tensor) -> None:
        (grad,) = torch.autograd.grad(loss, [self.theta])
        self.optimizer.zero_grad(set_to_none=True)
        self.theta.grad = grad
        self.optimizer.step()


def _train(model: nn.Module, batch: Mapping[str, Any], layer: int, clean: _Clean,
           adversaries: _Adversaries, output_fn: OutputFn, eps: float,
           steps: int) -> dict[str, torch.Tensor]:
    """``steps`` Adam steps on the ``K`` copies ``batch``; per adversary the iterate with the
    largest JSD whose TVD stayed within ε, or its last iterate when none did: ``jsd [K]``,
    ``tvd [K]``, ``adv [K, head, query, key]`` (CPU)."""
    k = adversaries.k
    best = {"jsd": torch.zeros(k), "tvd": torch.full((k,), math.inf),
            "adv": clean.original.expand(k, *clean.original.shape).clone()}
    best_jsd = torch.full((k,), -1.0)  # -1: no iterate within ε yet
    last: dict[str, torch.Tensor] = {}
    with torch.enable_grad(), capture(model, layers=[layer], parts=[Edit(adversaries.edit)]):
        for _step in range(steps):
            adv = adversaries.weights()
            probs = _probabilities(output_fn, model(**batch), k)
            tvd = divergence.tvd(probs, clean.probs.to(probs.device))  # [K]
            loss, jsd = adversaries.loss(adv, tvd, eps)
            # keep each adversary's best iterate within ε (values of this very forward)
            now = {"jsd": jsd.detach().cpu(), "tvd": tvd.detach().cpu(),
                   "adv": adv.detach().cpu()}
            better = (now["tvd"] <= eps) & (now["jsd"] > best_jsd)
            best_jsd = torch.where(better, now["jsd"], best_jsd)
            for name, value in now.items():
                best[name][better] = value[better]
                last[name] = value
            adversaries.step(loss)
    never = best_jsd < 0
    for name in best:
        best[name][never] = last[name][never]
    return best


def _result(layer: int, heads: tuple[int, ...], eps: float, best: dict[str, torch.Tensor],
            clean: _Clean) -> AdversarialResult:
    """The result and its one-line note on how the ε filter came out."""
    jsd = tuple(float(x) for x in best["jsd"])
    tvd = tuple(float(x) for x in best["tvd"])
    within = [j for j, t in zip(jsd, tvd, strict=True) if t <= eps]
    top = max(within) if within else None
    if within:
        note = (f"{len(within)} of {len(jsd)} adversaries kept the output within ε={eps:g}; "
                f"the most different reaches JSD {top:.3f} (ln 2 = {math.log(2):.3f})")
    else:
        note = (f"no adversary kept the output within ε={eps:g} (smallest TVD "
                f"{min(tvd):.3g}); max_jsd_within_eps is None")
    return AdversarialResult(layer=layer, heads=heads, eps=eps, jsd=jsd, tvd=tvd,
                             max_jsd_within_eps=top,
                             attention=_crop(best["adv"], clean.group, 0),
                             original=_crop(clean.original[None], clean.group, 0)[0], note=note)


def _device(model: nn.Module, fallback: torch.Tensor) -> torch.device:
    return input_device(model) if next(model.parameters(), None) is not None \
        else fallback.device


def _crop(weights: torch.Tensor, group: Any, b: int) -> torch.Tensor:
    """``[K, head, query, key]`` restricted to the example's real queries and keys."""
    q = group.query_valid[b].nonzero().flatten()
    key = group.key_valid[b].nonzero().flatten()
    return weights[:, :, q][..., key].contiguous()
