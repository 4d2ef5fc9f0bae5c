"""The perturbation experiments that search per text: ``erase`` (keys erased in ranked order
until the decision flips) and ``adversarial`` (the most different attention within ε of the
output). Each is one function and its parameter dataclass.

Each is registered in :data:`~attnprobe.perturb.experiments.EXPERIMENTS`; call them through
:func:`~attnprobe.perturb.experiments.run`, whose docstring lists their options and metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from attnprobe.capture.info import attention_sizes
from attnprobe.core.registry import one_of
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.perturb.adversarial import adversarial_attention, repeat_inputs
from attnprobe.perturb.budget import Footprint
from attnprobe.perturb.interventions import Erase
from attnprobe.perturb.job import (
    STREAMS,
    Job,
    Row,
    clean_output,
    derived_seed,
    generator_for,
    named_errors,
    perturbed_output,
    register_experiment,
    rows_of,
)
from attnprobe.perturb.params import Params, option
from attnprobe.perturb.readout import Reader, mean_row_max, measure, row_max_sums

__all__ = ["AdversarialParams", "EraseParams"]

RANK = 30  # after the one-edit experiments

DEFAULT_RANKINGS = ("attention", "integrated_gradients", "random")
_OWN_ORDERS = ("attention", "random")  # the key orders that are not attribution methods


# ----------------------------------------------------------------------------- erasure
def _check_rankings(rankings: tuple[str, ...]) -> None:
    from attnprobe.attribution.methods import METHODS

    valid = [*_OWN_ORDERS, *METHODS.names()]
    for name in rankings:
        if name not in valid:
            raise InputError(one_of("erase ranking", name, valid))
    if len(set(rankings)) != len(rankings):
        raise InputError(f"erase rankings repeat: {list(rankings)}")


@dataclass(frozen=True)
class EraseParams(Params):
    """Options of ``erase``."""

    max_erased: int = option(1, "report the change after erasing 1..N keys", minimum=1)
    rankings: tuple[str, ...] = option(
        DEFAULT_RANKINGS, "key orders: attention, random or any attribution method")
    n_steps: int = option(50, "Integrated Gradients steps of an integrated_gradients ranking",
                          minimum=1)
    seeded = True  # the random ranking

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_rankings(self.rankings)

    def record(self) -> dict[str, Any]:
        found = super().record()
        del found["rankings"]  # each row names its own ranking
        return found

    def idle(self) -> dict[str, str]:
        if any(_takes_steps(name) for name in self.rankings):
            return {}
        return {"n_steps": f"no ranking of {', '.join(self.rankings)} takes steps; "
                           "integrated_gradients does"}

    def target_unread(self) -> str | None:
        if any(name not in _OWN_ORDERS for name in self.rankings):
            return None  # an attribution ranking explains the target
        return (f"the rankings {', '.join(self.rankings)} read none; an attribution ranking "
                "such as integrated_gradients explains it")

    def metric_unread(self) -> str | None:
        return ("it erases keys until the output's decision (its argmax) flips and reports "
                "the distributional change of each step")

    def footprint(self, batch_size: int, n_texts: int, seq: int) -> Footprint:
        """``batch_size`` erasure steps per forward; a text of ``seq`` tokens has at most
        ``seq - 1`` steps (every key but one)."""
        return Footprint(max(1, min(batch_size, seq - 1)))


def _takes_steps(ranking: str) -> bool:
    if ranking in _OWN_ORDERS:
        return False
    from attnprobe.attribution.methods import METHODS

    return "n_steps" in {f.name for f in fields(METHODS.get(ranking))}


def _attribution_order(job: Job, method: str, i: int, text: str, before: torch.Tensor,
                       keys: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Keys in decreasing signed attribution of the target (most supporting first)."""
    from attnprobe.attribution.methods import attribute

    target = job.target
    if target is None:
        target = {"classifier": f"class:{int(before.argmax())}", "lm": "next-token",
                  "embedding": f"similarity:{text}"}[job.reader.kind]
    (found,) = attribute(job.model, job.tokenizer, [text], target, methods=[method],
                         n_steps=job.params.n_steps, seed=job.seed, truncation=job.truncation,
                         max_length=job.max_length)
    scores = found.scores.detach().double().cpu()
    if scores.shape[0] != n_tokens:
        raise InputError(f"example {i}: {method} scored {scores.shape[0]} tokens, the forward "
                         f"has {n_tokens}")
    return keys[scores[keys].argsort(descending=True, stable=True)]


def _erase_text(job: Job, i: int, text: str) -> list[Row]:
    decision = job.reader.kind != "embedding"
    scope, example = str(job.scope), str(i)
    max_erased = job.params.max_erased
    inputs = job.encode([text])
    with named_errors(job, f"example {i}"):
        before, cap = clean_output(job, inputs, keep=True)
        if len(cap.maps) != 1:
            raise InputError(f"erase ranks the keys of one attention stack; "
                             f"{type(job.model).__name__} has {len(cap.maps)}")
        received = cap.maps[0].pattern.double().sum(dim=(0, 1, 2))  # [key]
    keys = (received > 0).nonzero().flatten()
    n = len(keys)
    if n < 2:
        raise InputError(f"erase: example {i} has {n} key with attention weight > 0 in "
                         f"scope {job.scope}; nothing to erase (drop the text)")
    n_tokens = int(inputs["input_ids"].shape[1])
    # decisions: every step up to n - 1 of the n keys, to find the flip; else only those shown
    last = n - 1 if decision else min(max_erased, n - 1)
    rows = []
    for ranking in job.params.rankings:
        if ranking == "attention":
            order = keys[received[keys].argsort(descending=True, stable=True)]
        elif ranking == "random":
            order = keys[torch.randperm(n, generator=generator_for(job.seed, STREAMS["erase"],
                                                                    i))]
        else:
            order = _attribution_order(job, ranking, i, text, before, keys, n_tokens)
        mask = torch.zeros(last, 1, 1, n_tokens, dtype=torch.bool)
        for j in range(1, last + 1):  # row j - 1 erases the first j keys of the order
            mask[j - 1, 0, 0, order[:j]] = True
        parts = []
        for start in range(0, last, job.batch_size):
            chunk = mask[start:start + job.batch_size]
            with named_errors(job, f"example {i}, ranking {ranking}"):
                parts.append(perturbed_output(job, Erase(keys=chunk),
                                              repeat_inputs(inputs, chunk.shape[0])))
        after = torch.cat(parts)
        measures = measure(job.reader.kind, before, after)
        for j in range(1, min(max_erased, last) + 1):
            rows += rows_of(measures, j - 1, perturbation="erase",
                            params=job.record(ranking=ranking), scope=scope,
                            example=example, step=j)
        if decision:
            flips = (after.argmax(-1) != before.argmax(-1)).nonzero().flatten()
            first = int(flips[0]) + 1 if len(flips) else None
            params = job.record(ranking=ranking, n_keys=n)
            rows.append(Row("erase", params, scope, example, None, "flipped", 0.0,
                            float(first is not None)))
            rows.append(Row("erase", params, scope, example, None, "fraction_to_flip",
                            0.0, first / n if first is not None else math.nan))
    return rows


@register_experiment("erase", EraseParams, summary=(
    "Serrano & Smith: keys erased in every scoped row, one more per step, in the orders of "
    "rankings; the change after 1..max_erased keys and the fraction erased before the "
    "decision flips"))
def _erase(job: Job) -> list[Row]:
    """Serrano & Smith's erasure in attention, attribution and random order."""
    return job.per_text(lambda i, text: _erase_text(job, i, text))


# ----------------------------------------------------------------------------- adversarial
def _probabilities(reader: Reader, before: torch.Tensor) -> Callable[[Any], torch.Tensor]:
    """``output -> [batch, classes]`` probabilities for :func:`adversarial_attention`.

    Embedding models get two "classes", ``((1 + cos) / 2, (1 − cos) / 2)`` of the cosine to
    the unperturbed embedding, so the TVD to the clean output is half the cosine distance.
    """
    if reader.kind != "embedding":
        return lambda output: reader(output).softmax(-1)
    reference = before[0]

    def readout(output: Any) -> torch.Tensor:
        cos = F.cosine_similarity(reader(output), reference[None].to(torch.float32), dim=-1)
        p = ((1.0 + cos) / 2.0).clamp(0.0, 1.0)
        return torch.stack([p, 1.0 - p], dim=-1)

    return readout


@dataclass(frozen=True)
class AdversarialParams(Params):
    """Options of ``adversarial``."""

    eps: float = option(0.01, "output budget: TVD of the output probabilities (embedding "
                              "models: half the cosine distance)", minimum=0, strict=True)
    n_adversaries: int = option(5, "adversaries per text and layer, optimised as one batch",
                                minimum=1, flag="--adversaries")
    steps: int = option(500, "Adam steps", minimum=1)
    lr: float = option(0.01, "Adam learning rate", minimum=0, strict=True)
    seeded = True  # the adversaries' initial logits

    def metric_unread(self) -> str | None:
        return ("its measure is the attention's JSD under a TVD budget on the output "
                "distribution (eps)")

    def footprint(self, batch_size: int, n_texts: int, seq: int) -> Footprint:
        return Footprint(self.n_adversaries, rows_by="n_adversaries", grad=True)


def _adversarial_text(job: Job, i: int, text: str) -> list[Row]:
    n_layers, n_heads = attention_sizes(job.model)
    p = job.params
    inputs = job.encode([text])
    with named_errors(job, f"example {i}"):
        before, _ = clean_output(job, inputs)
    fn = _probabilities(job.reader, before)
    rows = []
    for layer in job.scope.layers_in(n_layers):
        scoped = job.scope.heads_of(layer, n_heads)
        with named_errors(job, f"example {i}, layer {layer}"):
            found = adversarial_attention(
                job.model, inputs, layer=layer, heads=scoped, output_fn=fn, eps=p.eps,
                n_adversaries=p.n_adversaries, steps=p.steps, lr=p.lr,
                seed=derived_seed(job.seed, STREAMS["adversarial"], i, layer))
        jsd = torch.tensor(found.jsd, dtype=torch.float64)
        tvd = torch.tensor(found.tvd, dtype=torch.float64)
        within = tvd <= found.eps
        best = int(torch.where(within, jsd, -1.0).argmax()) if bool(within.any()) \
            else int(tvd.argmin())
        max_before = mean_row_max(*row_max_sums(found.original[None], found.original[None]))
        max_after = mean_row_max(*row_max_sums(found.attention[best][None],
                                               found.original[None]))
        row_scope = str(Scope(layers=(layer,)) if len(scoped) == n_heads
                        else Scope(layers=(layer,), heads=scoped))
        params = job.record()
        for metric, base, value in (
                ("jsd", 0.0, float(jsd[best]) if bool(within.any()) else math.nan),
                ("tvd", 0.0, float(tvd[best])),
                ("within_eps", 1.0, float(bool(within.any()))),
                ("max_attention", float(max_before[0]), float(max_after[0]))):
            rows.append(Row("adversarial", params, row_scope, str(i), None, metric, base,
                            value))
    return rows


@register_experiment("adversarial", AdversarialParams, summary=(
    "Jain & Wallace: per text and scoped layer, the most different attention (JSD) that keeps "
    "the output within TVD eps, from n_adversaries Adam searches"))
def _adversarial(job: Job) -> list[Row]:
    """Jain & Wallace's adversarial attention per example and scoped layer."""
    return job.per_text(lambda i, text: _adversarial_text(job, i, text))
