"""Perturbation experiments as tidy tables: ``run(model, tokenizer, texts, experiment)``.

Every experiment is one small function registered in :data:`EXPERIMENTS`, and every one
returns the columns :data:`RUN_COLUMNS`, so tables concatenate over experiments, models and
runs:

===============  ===========================================================================
experiment       what it does (``perturbation`` column)
===============  ===========================================================================
``permute``      Jain & Wallace: per example, ``n_permutations`` permutations of the scoped
                 rows (each over its valid keys) in one batched forward, one permutation per
                 batch row; rows: the median / mean / max over the permutations of every
                 output change, and the example's ``max_attention`` (``permute``)
``dirichlet``    Wiegreffe & Pinter's random baseline: the same with ``n_permutations``
                 re-draws of every scoped row from Dirichlet(``alpha``) (``dirichlet``)
``uniform``      Kovaleva / W&P: uniform weights over the valid keys of the scope
``ablate``       Michel et al.: the scoped heads' weights zeroed, their output is 0 (``zero``)
``mean``         mean-ablation: the scoped heads' outputs replaced by their mean output over
                 the same ``texts`` (:func:`~attnprobe.perturb.head_output_means`; transformers
                 models only) (``mean``)
``erase``        Serrano & Smith: keys erased in every scoped row, one more per step, in three
                 orders — attention received, an attribution method (Integrated Gradients),
                 random; the change for ``k = 1..K`` and the fraction of keys erased before
                 the decision flips (``erase``)
``adversarial``  Jain & Wallace: per example and scoped layer, the most different attention
                 (JSD) that keeps the output within TVD ``eps`` (``adversarial``)
``importance``   Michel et al.: head importance ``E|∂L/∂ξ_h|`` of the scoped heads, and the
                 pruning curve in order of increasing importance (``zero``)
===============  ===========================================================================

**Columns.** ``experiment``, ``perturbation``, ``params`` (the perturbation's parameters as a
JSON object), ``scope`` (``"all"``, ``"layers:3"``, ``"heads:3.5"``; the scope the row's
perturbation acted on), ``example_id`` (the text's index as a string; ``"all"`` for rows about
the whole corpus), ``step`` (``k`` of ``erase``, heads pruned of ``importance``; ``<NA>`` for
experiments without steps), ``metric``, ``baseline`` (the metric without the perturbation),
``perturbed`` (with it) and ``change = perturbed − baseline``. Distances and scores of the
perturbation itself (``tvd``, ``jsd``, ``flip``, ``cosine_distance``, ``importance`` ...)
have ``baseline = 0``, so ``change == perturbed``.

**Outputs** (``output=``): ``"classifier"`` — logits ``[batch, classes]``, compared as softmax
distributions: ``tvd``, ``jsd`` (nats), ``flip`` (1 when the argmax changed) and ``top_prob``
(the probability of the class the unperturbed model ranks first); ``"lm"`` — the next-token
distribution at the last real position, with the same metrics; ``"embedding"`` — the
attention-masked mean of the last hidden state (of the output tensor for models that return
one tensor ``[batch, seq, dim]``): ``cosine_distance`` and ``l2_distance``. ``"auto"`` reads one
forward: logits ``[batch, classes]`` → classifier; a transformers causal LM, or a causal
reference model whose output is ``[batch, seq, vocab]`` → lm; otherwise embedding.

**Each forward goes through the capture seam** (:func:`attnprobe.capture`), the unperturbed
one too, so baseline and perturbed outputs come from the same attention implementation and a
model whose attention cannot be reached fails at once: ``AttentionUnavailableError`` (no hook
points, a transformers model that bypasses AttentionInterface) or ``HookNotFiredError`` (a
scoped layer never ran), with the experiment named in the message. An edit that changed no
weight is ``EditNotAppliedError`` for ``uniform``/``ablate``/``mean``/``erase``. The
exception is ``permute`` (and ``dirichlet``): permuting a uniform row, or a row whose weight
sits on one key, is an identity, and "the output does not care" is then the measurement, so
such an example reports exactly zero change (the seam demonstrably ran: otherwise one of the
errors above is raised).

**Reproducible from ``seed``.** Permutation ``j`` of example ``i`` draws from its own CPU
generator seeded from ``(seed, i, j)``: the same call gives the same table, and batching the
permutations (``batch_size``) does not change any draw — ``n`` rows in one forward equal ``n``
forwards of one row.
"""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from attnprobe.capture import capture
from attnprobe.errors import (
    AttentionUnavailableError,
    EditNotAppliedError,
    HookNotFiredError,
    InputError,
)
from attnprobe.extraction import _batches, _model_inputs, check_texts, encode
from attnprobe.perturb import (
    INTERVENTIONS,
    Dirichlet,
    Erase,
    Mean,
    Permute,
    Scope,
    Uniform,
    Zero,
    adversarial_attention,
    attention_sizes,
    head_importance,
    head_output_means,
    output_change,
    perturbed,
    pruning_curve,
)
from attnprobe.registry import Registry, one_of
from attnprobe.types import head_id

__all__ = ["CORPUS", "EXPERIMENTS", "OUTPUTS", "RUN_COLUMNS", "Experiment", "run"]

RUN_COLUMNS = ("experiment", "perturbation", "params", "scope", "example_id", "step", "metric",
               "baseline", "perturbed", "change")
CORPUS = "all"  # example_id of rows about the whole corpus
OutputChoice = Literal["auto", "classifier", "lm", "embedding"]
OUTPUTS: tuple[str, ...] = ("auto", "classifier", "lm", "embedding")
DEFAULT_RANKINGS = ("attention", "integrated_gradients", "random")
_STREAM = {"draws": 0, "erase": 1, "adversarial": 2}  # independent random streams per use


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Experiment:
    """One experiment: ``fn(job) -> rows`` and the extra keyword options it accepts."""

    name: str
    fn: Callable[[Job], list[_Row]] = field(repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)


EXPERIMENTS: Registry[Experiment] = Registry("experiment")
_COMMON_OPTIONS = MappingProxyType({"batch_size": None, "truncation": False})


def _experiment(name: str, **options: Any) -> Callable[[Callable], Callable]:
    def add(fn: Callable) -> Callable:
        EXPERIMENTS.register(name)(Experiment(name, fn, MappingProxyType(options)))
        return fn

    return add


class _Row(NamedTuple):
    perturbation: str
    params: dict[str, Any]
    scope: str
    example_id: str
    step: int | None
    metric: str
    baseline: float
    perturbed: float


@dataclass(frozen=True, eq=False)
class Job:
    """Everything an experiment function needs (built and checked by :func:`run`)."""

    name: str
    model: nn.Module
    tokenizer: Any
    texts: list[str]
    scope: Scope
    reader: Reader
    n_permutations: int
    seed: int
    eps: float
    k: int
    alpha: float
    target: Any
    progress: bool
    options: dict[str, Any]

    @property
    def batch_size(self) -> int | None:
        return self.options["batch_size"]

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        batch = encode(self.model, self.tokenizer, texts, truncation=self.options["truncation"])
        return _model_inputs(self.model, batch)

    def examples(self) -> Iterable[tuple[int, str]]:
        items = enumerate(self.texts)
        if not self.progress:
            return items
        from attnprobe._optional import require

        return require("tqdm").tqdm(items, total=len(self.texts), unit="text",
                                    desc=f"perturb {self.name}")


# ----------------------------------------------------------------------------- outputs
def _output_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _logits(output: Any) -> torch.Tensor | None:
    logits = getattr(output, "logits", None)
    if logits is None and not hasattr(output, "keys"):  # HF ModelOutputs are mappings
        logits = _output_tensor(output)
    return logits if isinstance(logits, torch.Tensor) else None


def _hidden(output: Any) -> torch.Tensor | None:
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and not hasattr(output, "keys"):
        hidden = _output_tensor(output)
    return hidden if isinstance(hidden, torch.Tensor) and hidden.ndim == 3 else None


def _last_real(inputs: Mapping[str, torch.Tensor] | None, batch: int, seq: int,
               device: torch.device) -> torch.Tensor:
    mask = inputs.get("attention_mask") if inputs is not None else None
    if mask is None:
        return torch.full((batch,), seq - 1, dtype=torch.long, device=device)
    mask = mask.to(device) != 0
    return seq - 1 - mask.flip(-1).to(torch.long).argmax(-1)


@dataclass(frozen=True)
class Reader:
    """Reads one vector per example off a model output: ``[batch, classes | vocab | dim]``.

    ``inputs`` (with ``attention_mask``) locate the last real token (lm) and the real tokens
    to average (embedding); without them every position is real.
    """

    kind: Literal["classifier", "lm", "embedding"]

    def __call__(self, output: Any, inputs: Mapping[str, torch.Tensor] | None = None
                 ) -> torch.Tensor:
        if self.kind == "embedding":
            hidden = _hidden(output)
            if hidden is None:
                raise InputError(f"output='embedding' needs the last hidden state [batch, seq, "
                                 f"dim]; the model returns {type(output).__name__} without one "
                                 "(load it without an output head, or use output='classifier' "
                                 "or 'lm')")
            mask = inputs.get("attention_mask") if inputs is not None else None
            if mask is None:
                return hidden.mean(1)
            weights = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)
            return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        logits = _logits(output)
        want = 2 if self.kind == "classifier" else 3
        if logits is None or logits.ndim != want:
            got = "no logits" if logits is None else f"logits of shape {list(logits.shape)}"
            shape = "[batch, classes]" if want == 2 else "[batch, seq, vocab]"
            raise InputError(f"output={self.kind!r} needs logits {shape}; the model gives {got}"
                             " (choose another output=)")
        if self.kind == "classifier":
            return logits
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, _last_real(inputs, logits.shape[0], logits.shape[1], logits.device)]


def _is_causal_lm(model: nn.Module, logits: torch.Tensor | None) -> bool:
    if logits is None or logits.ndim != 3:
        return False
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        name = type(model).__name__
        return name.endswith("ForCausalLM") or name.endswith("LMHeadModel")
    config = getattr(model, "config", None)
    return bool(getattr(config, "causal", False)) \
        and logits.shape[-1] == getattr(config, "vocab_size", None)


def _reader(model: nn.Module, choice: str, output: Any) -> Reader:
    """The reader ``choice`` names, or the one ``auto`` picks from a forward's output."""
    if choice != "auto":
        return Reader(choice)  # type: ignore[arg-type]
    logits = _logits(output)
    if logits is not None and logits.ndim == 2:
        return Reader("classifier")
    if _is_causal_lm(model, logits):
        return Reader("lm")
    if _hidden(output) is not None:
        return Reader("embedding")
    raise InputError(f"output='auto' cannot tell what {type(model).__name__} returns "
                     f"({type(output).__name__}): pass output='classifier', 'lm' or 'embedding'")


# ----------------------------------------------------------------------------- measuring
def _measure(kind: str, before: torch.Tensor, after: torch.Tensor
             ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per example ``(baseline, perturbed)`` of every metric of an output kind, ``[batch]``."""
    before = before.expand_as(after)
    zero = torch.zeros(after.shape[0], dtype=torch.float64)
    if kind == "embedding":
        change = output_change("embedding", before.double(), after.double())
        return {m: (zero, v.double().cpu()) for m, v in change.items()}
    change = output_change("classifier", before.double(), after.double())
    top = before.argmax(-1, keepdim=True)
    top_before = before.double().softmax(-1).gather(-1, top)[:, 0]
    top_after = after.double().softmax(-1).gather(-1, top)[:, 0]
    out = {m: (zero, change[m].double().cpu()) for m in ("tvd", "jsd", "flip")}
    out["top_prob"] = (top_before.cpu(), top_after.cpu())
    return out


def _distances(kind: str) -> tuple[str, ...]:
    return ("cosine_distance", "l2_distance") if kind == "embedding" else ("tvd", "jsd", "flip")


def _rows_of(measures: Mapping[str, tuple[torch.Tensor, torch.Tensor]], row: int, *,
             perturbation: str, params: dict[str, Any], scope: str, example: str,
             step: int | None = None) -> list[_Row]:
    return [_Row(perturbation, params, scope, example, step, metric, float(base[row]),
                 float(after[row])) for metric, (base, after) in measures.items()]


def _row_max(pattern: torch.Tensor, original: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per leading index: the sum of each row's largest weight over the rows of ``original``
    with at least two weights > 0, and how many such rows; ``[..., query, key]`` -> ``[...]``
    summed over every axis but the first."""
    eligible = (original > 0).sum(-1) >= 2
    top = torch.where(eligible, pattern.amax(-1), 0.0).double()
    dims = tuple(range(1, top.ndim))
    return top.sum(dims).cpu(), eligible.sum(dims).cpu().double()


def _mean_row_max(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    # rows with a single valid key put all their weight on it: 1.0 when there is nothing else
    return torch.where(count > 0, total / count.clamp(min=1), 1.0)


# ----------------------------------------------------------------------------- plumbing
def _seed(*keys: int) -> int:
    """A seed derived from a tuple of non-negative ints (``(seed, stream, i, j)``)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, dtype=np.uint32)[0])


def _generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded with :func:`_seed` of ``keys``."""
    return torch.Generator().manual_seed(_seed(*keys))


def _repeat(inputs: Mapping[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    return {k: v.expand(n, *v.shape[1:]).contiguous() for k, v in inputs.items()}


@contextmanager
def _named(job: Job, where: str) -> Iterator[None]:
    """Re-raise capture-seam errors with the experiment and the example in the message."""
    try:
        yield
    except (AttentionUnavailableError, HookNotFiredError, EditNotAppliedError) as exc:
        message = exc.args[0] if exc.args else type(exc).__name__
        raise type(exc)(f"perturb {job.name} ({where}, scope {job.scope}): {message}") from exc


def _clean(job: Job, inputs: Mapping[str, torch.Tensor], *, keep: bool = False
           ) -> tuple[torch.Tensor, Any]:
    """The unperturbed output vector per example, through the capture seam (as the perturbed
    forwards), and the capture (``keep``: the scoped heads' maps)."""
    with torch.no_grad(), capture(job.model, layers=job.scope.layers, heads=job.scope.heads,
                                  keep=keep) as cap:
        output = job.model(**inputs)
    return job.reader(output, inputs).detach(), cap


def _perturbed_output(job: Job, intervention: Any, inputs: Mapping[str, torch.Tensor]
                      ) -> torch.Tensor:
    try:
        with torch.no_grad(), perturbed(job.model, intervention, job.scope, seed=job.seed):
            output = job.model(**inputs)
    except EditNotAppliedError as exc:
        raise EditNotAppliedError(
            f"{intervention.name} changed no attention weight: every scoped row already looks "
            "the way it would make it (e.g. uniform, or all weight on one key); choose another "
            f"scope or drop the text ({exc})") from exc
    return job.reader(output, inputs).detach()


def _json(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


# ----------------------------------------------------------------------------- random draws
class _RowEdit:
    """An edit that gives every batch row its own generator (row ``b`` draws exactly as a
    batch-1 forward with ``generators[b]`` would), and tallies each row's ``max_attention``
    after the edit over the scoped heads (``after``: sums and row counts per batch row)."""

    def __init__(self, intervention: Any, heads: tuple[int, ...] | None,
                 generators: Sequence[torch.Generator]) -> None:
        self.intervention = intervention
        self.heads = heads
        self.generators = list(generators)
        n = len(self.generators)
        self.after = (torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))

    def __call__(self, layer: int, pattern: torch.Tensor) -> torch.Tensor:
        if pattern.shape[0] != len(self.generators):
            raise InputError(f"the forward ran a batch of {pattern.shape[0]} rows; expected "
                             f"{len(self.generators)} copies of one example")
        edited = torch.cat([self.intervention(pattern[b:b + 1], self.heads, g, layer=layer)
                            for b, g in enumerate(self.generators)])
        index = list(self.heads) if self.heads is not None else slice(None)
        total, count = _row_max(edited[:, index].detach(), pattern[:, index].detach())
        self.after[0].add_(total)
        self.after[1].add_(count)
        return edited


def _draws(job: Job, intervention: Any, perturbation: str, params: dict[str, Any]) -> list[_Row]:
    rows = []
    n = job.n_permutations
    size = job.batch_size or n
    distances = _distances(job.reader.kind)
    scope = str(job.scope)
    for i, text in job.examples():
        inputs = job.encode([text])
        with _named(job, f"example {i}"):
            before, cap = _clean(job, inputs, keep=True)
            sums = [_row_max(m.pattern[None], m.pattern[None]) for m in cap.maps]  # per stack
            max_before = _mean_row_max(sum(s[0] for s in sums), sum(s[1] for s in sums))[0]
            parts, max_after = [], []
            for start in range(0, n, size):
                count = min(n, start + size) - start
                edit = _RowEdit(intervention, job.scope.heads,
                                [_generator(job.seed, _STREAM["draws"], i, j)
                                 for j in range(start, start + count)])
                copies = _repeat(inputs, count)
                try:
                    with torch.no_grad(), capture(job.model, layers=job.scope.layers,
                                                  heads=job.scope.heads, keep=False, edit=edit):
                        output = job.model(**copies)
                    parts.append(job.reader(output, copies).detach())
                except EditNotAppliedError:  # no draw moved any weight: exactly no change
                    parts.append(before.expand(count, *before.shape[1:]))
                max_after.append(_mean_row_max(*edit.after))
        measures = _measure(job.reader.kind, before, torch.cat(parts))
        example = str(i)
        for metric in distances:
            values = measures[metric][1].numpy()
            for stat, value in (("median", np.median(values)), ("mean", values.mean()),
                                ("max", values.max())):
                rows.append(_Row(perturbation, params, scope, example, None,
                                 f"{metric}_{stat}", 0.0, float(value)))
        rows.append(_Row(perturbation, params, scope, example, None, "max_attention",
                         float(max_before), float(torch.cat(max_after).mean())))
    return rows


@_experiment("permute")
def _permute(job: Job) -> list[_Row]:
    """Jain & Wallace's permutations, ``n_permutations`` per example in one batch."""
    return _draws(job, Permute(), "permute", {"n_permutations": job.n_permutations,
                                              "seed": job.seed})


@_experiment("dirichlet")
def _dirichlet(job: Job) -> list[_Row]:
    """Wiegreffe & Pinter's random re-draws from Dirichlet(alpha), batched like permute."""
    return _draws(job, Dirichlet(alpha=job.alpha), "dirichlet",
                  {"alpha": job.alpha, "n_draws": job.n_permutations, "seed": job.seed})


# ----------------------------------------------------------------------------- one edit
def _one_shot(job: Job, intervention: Any, params: dict[str, Any]) -> list[_Row]:
    rows = []
    scope = str(job.scope)
    spans = _batches(len(job.texts), job.batch_size or 16)
    if job.progress:
        from attnprobe._optional import require

        spans = require("tqdm").tqdm(spans, unit="batch", desc=f"perturb {job.name}")
    for span in spans:
        inputs = job.encode(job.texts[span])
        ids = ", ".join(str(i) for i in range(span.start, span.stop))
        where = f"text {ids}" if span.stop - span.start == 1 else f"texts {ids}"
        with _named(job, where):
            before, _ = _clean(job, inputs)
            after = _perturbed_output(job, intervention, inputs)
        measures = _measure(job.reader.kind, before, after)
        for row, i in enumerate(range(span.start, span.stop)):
            rows += _rows_of(measures, row, perturbation=intervention.name, params=params,
                             scope=scope, example=str(i))
    return rows


@_experiment("uniform")
def _uniform(job: Job) -> list[_Row]:
    """Uniform weights over the valid keys of every scoped row."""
    return _one_shot(job, Uniform(), {})


@_experiment("ablate")
def _ablate(job: Job) -> list[_Row]:
    """Zero-ablation: the scoped heads contribute nothing."""
    return _one_shot(job, Zero(), {})


@_experiment("mean")
def _mean(job: Job) -> list[_Row]:
    """Mean-ablation with each head's mean output over the same texts."""
    means = head_output_means(job.model, job.tokenizer, job.texts, layers=job.scope.layers,
                              truncation=job.options["truncation"])
    return _one_shot(job, Mean(means=means), {"means_from": "texts", "n_texts": len(job.texts)})


# ----------------------------------------------------------------------------- erasure
def _check_rankings(rankings: Any) -> tuple[str, ...]:
    from attnprobe.attribution.methods import METHODS

    if isinstance(rankings, str):
        rankings = [rankings]
    rankings = tuple(rankings)
    valid = ["attention", "random", *METHODS.names()]
    if not rankings:
        raise InputError(f"erase needs at least one ranking; choose from {', '.join(valid)}")
    for name in rankings:
        if name not in valid:
            raise InputError(one_of("erase ranking", name, valid))
    if len(set(rankings)) != len(rankings):
        raise InputError(f"erase rankings repeat: {list(rankings)}")
    return rankings


def _attribution_order(job: Job, method: str, i: int, text: str, before: torch.Tensor,
                       keys: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Keys in decreasing signed attribution of the target (most supporting first)."""
    from attnprobe.attribution.methods import attribute

    target = job.target
    if target is None:
        target = {"classifier": f"class:{int(before.argmax())}", "lm": "next-token",
                  "embedding": f"similarity:{text}"}[job.reader.kind]
    (found,) = attribute(job.model, job.tokenizer, [text], target, methods=[method],
                         n_steps=job.options["n_steps"], seed=job.seed,
                         truncation=job.options["truncation"])
    scores = found.scores.detach().double().cpu()
    if scores.shape[0] != n_tokens:
        raise InputError(f"example {i}: {method} scored {scores.shape[0]} tokens, the forward "
                         f"has {n_tokens}")
    return keys[scores[keys].argsort(descending=True, stable=True)]


@_experiment("erase", rankings=DEFAULT_RANKINGS, n_steps=50)
def _erase(job: Job) -> list[_Row]:
    """Serrano & Smith's erasure in attention, attribution and random order."""
    rankings = _check_rankings(job.options["rankings"])
    decision = job.reader.kind != "embedding"
    scope = str(job.scope)
    rows = []
    for i, text in job.examples():
        inputs = job.encode([text])
        example = str(i)
        with _named(job, f"example {i}"):
            before, cap = _clean(job, inputs, keep=True)
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
        last = n - 1 if decision else min(job.k, n - 1)  # at most n - 1 of the n keys
        for ranking in rankings:
            if ranking == "attention":
                order = keys[received[keys].argsort(descending=True, stable=True)]
            elif ranking == "random":
                draw = torch.randperm(n, generator=_generator(job.seed, _STREAM["erase"], i))
                order = keys[draw]
            else:
                order = _attribution_order(job, ranking, i, text, before, keys, n_tokens)
            mask = torch.zeros(last, 1, 1, n_tokens, dtype=torch.bool)
            for j in range(1, last + 1):  # row j - 1 erases the first j keys of the order
                mask[j - 1, 0, 0, order[:j]] = True
            size = job.batch_size or last
            parts = []
            for start in range(0, last, size):
                chunk = mask[start:start + size]
                where = f"example {i}, ranking {ranking}"
                with _named(job, where):
                    parts.append(_perturbed_output(job, Erase(keys=chunk),
                                                   _repeat(inputs, chunk.shape[0])))
            after = torch.cat(parts)
            measures = _measure(job.reader.kind, before, after)
            for j in range(1, min(job.k, last) + 1):
                rows += _rows_of(measures, j - 1, perturbation="erase",
                                 params={"k": j, "ranking": ranking}, scope=scope,
                                 example=example, step=j)
            if decision:
                flips = (after.argmax(-1) != before.argmax(-1)).nonzero().flatten()
                first = int(flips[0]) + 1 if len(flips) else None
                params = {"n_keys": n, "ranking": ranking}
                rows.append(_Row("erase", params, scope, example, None, "flipped", 0.0,
                                 float(first is not None)))
                rows.append(_Row("erase", params, scope, example, None, "fraction_to_flip",
                                 0.0, first / n if first is not None else math.nan))
    return rows


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


@_experiment("adversarial", n_adversaries=5, steps=500, lr=0.01)
def _adversarial(job: Job) -> list[_Row]:
    """Jain & Wallace's adversarial attention per example and scoped layer."""
    heads = job.scope.heads or tuple(range(attention_sizes(job.model)[1]))
    layers = job.scope.resolved_layers(job.model)
    opts = {name: job.options[name] for name in ("n_adversaries", "steps", "lr")}
    rows = []
    for i, text in job.examples():
        inputs = job.encode([text])
        with _named(job, f"example {i}"):
            before, _ = _clean(job, inputs)
        fn = _probabilities(job.reader, before)
        for layer in layers:
            with _named(job, f"example {i}, layer {layer}"):
                found = adversarial_attention(
                    job.model, inputs, layer=layer, heads=heads, output_fn=fn, eps=job.eps,
                    seed=_seed(job.seed, _STREAM["adversarial"], i, layer),
                    **opts)
            jsd = torch.tensor(found.jsd, dtype=torch.float64)
            tvd = torch.tensor(found.tvd, dtype=torch.float64)
            within = tvd <= found.eps
            best = int(torch.where(within, jsd, -1.0).argmax()) if bool(within.any()) \
                else int(tvd.argmin())
            max_before = _mean_row_max(*_row_max(found.original[None], found.original[None]))
            max_after = _mean_row_max(*_row_max(found.attention[best][None],
                                                found.original[None]))
            params = {"eps": found.eps, **opts, "seed": job.seed}
            row_scope = str(Scope(layers=(layer,), heads=job.scope.heads))
            example = str(i)
            for metric, base, value in (
                    ("jsd", 0.0, float(jsd[best]) if bool(within.any()) else math.nan),
                    ("tvd", 0.0, float(tvd[best])),
                    ("within_eps", 1.0, float(bool(within.any()))),
                    ("max_attention", float(max_before[0]), float(max_after[0]))):
                rows.append(_Row("adversarial", params, row_scope, example, None, metric,
                                 base, value))
    return rows


# ----------------------------------------------------------------------------- importance
def _loss_fn(job: Job) -> Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor]:
    """One loss per example: ``−target`` when a target is given, else the cross-entropy of
    the model's own prediction (classifier: the top class; lm: the top next token)."""
    reader = job.reader
    if job.target is not None:
        from attnprobe.attribution.targets import parse_target

        target = parse_target(job.target, job.model, job.tokenizer)
        if not target.ready:
            raise InputError(f"importance scores every text in one batch; target "
                             f"{target.spec!r} picks a token per text: give next-token:ID, or no "
                             "target (the loss is then the model's own prediction)")
        return lambda output, inputs: -target(output, inputs)
    if reader.kind == "embedding":
        raise InputError("importance on an embedding model needs a scalar to differentiate: "
                         "pass target='similarity:TEXT' (CLI: --target \"similarity:...\")")

    def loss(output: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        logits = reader(output, inputs)
        return F.cross_entropy(logits, logits.argmax(-1).detach(), reduction="none")

    return loss


@_experiment("importance", prune_steps=None)
def _importance(job: Job) -> list[_Row]:
    """Michel et al.'s head importance and pruning curve, least important heads first."""
    with _named(job, "head importance"):
        frame = head_importance(job.model, job.tokenizer, job.texts, _loss_fn(job),
                                batch_size=job.batch_size or 8)
    if job.scope.layers is not None:
        frame = frame[frame["layer"].isin(job.scope.layers)]
    if job.scope.heads is not None:
        frame = frame[frame["head"].isin(job.scope.heads)]
    rows = []
    estimate = {"estimate": "gradient", "normalised": "per layer (l2)"}
    for item in frame.itertuples():
        scope = str(Scope(layers=(item.layer,), heads=(item.head,)))
        rows.append(_Row("zero", estimate, scope, CORPUS, None, "importance", 0.0,
                         float(item.importance)))
        rows.append(_Row("zero", {**estimate, "normalised": "no"}, scope, CORPUS, None,
                         "importance_raw", 0.0, float(item.importance_raw)))
    order = frame.sort_values(["importance", "layer", "head"], kind="stable")
    order = list(zip(order["layer"].tolist(), order["head"].tolist(), strict=True))
    points: list[dict[str, float]] = []
    reference: list[torch.Tensor] = []

    def metric_fn(output: Any, inputs: Mapping[str, torch.Tensor]) -> float:
        values = job.reader(output, inputs).detach()
        if not reference:
            reference.append(values)
        measures = _measure(job.reader.kind, reference[0], values)
        point = {m: float(after.mean()) for m, (_, after) in measures.items()
                 if m in _distances(job.reader.kind)}
        if job.reader.kind != "embedding":
            point = {"agreement": 1.0 - point["flip"], **point}
        points.append(point)
        return next(iter(point.values()))

    with _named(job, "pruning curve"):
        curve = pruning_curve(job.model, job.tokenizer, job.texts, metric_fn, order,
                              steps=job.options["prune_steps"])
    scope = str(job.scope)
    for n, point in zip(curve["n_pruned"].tolist(), points, strict=True):
        if n == 0:
            continue
        params = {"order": "increasing importance", "pruned": [head_id(*h) for h in order[:n]]}
        for metric, value in point.items():
            base = points[0][metric]
            rows.append(_Row("zero", params, scope, CORPUS, int(n), metric, base, value))
    return rows


# ----------------------------------------------------------------------------- entry point
def _check_number(name: str, value: Any, *, integer: bool, minimum: float,
                  strict: bool = False) -> None:
    kind = "an integer" if integer else "a finite number"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if ok and not integer:
        ok = math.isfinite(value)
    if ok:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(f"{name} must be {kind} {bound}; got {value!r}")


def _options(name: str, experiment: Experiment, params: Mapping[str, Any]) -> dict[str, Any]:
    accepted = {**_COMMON_OPTIONS, **experiment.options}
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise InputError(f"experiment {name!r} takes the options {', '.join(sorted(accepted))}; "
                         f"got {', '.join(unknown)}")
    options = {**accepted, **params}
    if options["batch_size"] is not None:
        _check_number("batch_size", options["batch_size"], integer=True, minimum=1)
    for key in ("n_adversaries", "steps", "n_steps"):
        if key in options:
            _check_number(key, options[key], integer=True, minimum=1)
    if "lr" in options:
        _check_number("lr", options["lr"], integer=False, minimum=0, strict=True)
    if options.get("prune_steps") is not None:
        _check_number("prune_steps", options["prune_steps"], integer=True, minimum=1)
    return options


def _experiment_named(name: Any) -> Experiment:
    if isinstance(name, str) and name in EXPERIMENTS:
        return EXPERIMENTS.get(name)
    message = one_of("experiment", name, EXPERIMENTS.names())
    if isinstance(name, str) and name in INTERVENTIONS:
        runs = {"zero": "ablate", "erase": "erase", "permute": "permute",
                "uniform": "uniform", "mean": "mean", "dirichlet": "dirichlet"}.get(name)
        message += f" ({name!r} is a perturbation; the experiment {runs!r} applies it)"
    raise InputError(message)


def run(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, experiment: str, *,
        scope: str | Scope = "all", output: OutputChoice = "auto", n_permutations: int = 100,
        seed: int = 0, eps: float = 0.01, k: int = 1, alpha: float = 1.0, target: Any = None,
        progress: bool = False, **params: Any) -> pd.DataFrame:
    """Run one perturbation experiment over ``texts`` and return a tidy table.

    Args:
        model / tokenizer: an attnprobe reference model or a transformers model (any
            attention backend), in eval mode, and its tokenizer.
        texts: the examples (one row group per text; ``example_id`` is the index).
        experiment: a name in :data:`EXPERIMENTS` (see the module docstring).
        scope: which heads are perturbed: ``"all"``, ``"layer:3"``, ``"layers:2,3"``,
            ``"head:3.5"``, ``"heads:3.5,3.7"`` or a :class:`~attnprobe.perturb.Scope`.
        output: ``"auto"``, ``"classifier"``, ``"lm"`` or ``"embedding"`` (module docstring).
        n_permutations: permutations (``permute``) or re-draws (``dirichlet``) per example.
        seed: seeds every random choice (permutations, draws, the random erasure order,
            adversary initialisations); the same call gives the same table.
        eps: ``adversarial``: the output budget ε (TVD of the output probabilities; for
            embedding models half the cosine distance).
        k: ``erase``: report the change for ``k = 1..K`` erased keys.
        alpha: ``dirichlet``: the concentration.
        target: ``erase``: what the attribution ranking explains (default: the predicted
            class ``class:K``, ``next-token``, or ``similarity:<the text itself>`` for
            embedding models); ``importance``: the loss is ``−target`` (default: the
            cross-entropy of the model's own prediction; embedding models need
            ``similarity:TEXT``). A spec such as ``"class:1"``, a Target or a callable.
        progress: show a progress bar (tqdm) over the texts.
        **params: options of the experiment: every experiment takes ``batch_size`` (forward
            rows: texts for uniform/ablate/mean, default 16; permutations or erasure steps per
            forward, default all of them) and ``truncation``; ``erase``: ``rankings`` (default
            attention, integrated_gradients, random; any attribution method name) and
            ``n_steps`` (Integrated Gradients); ``adversarial``: ``n_adversaries`` (5),
            ``steps`` (500), ``lr`` (0.01); ``importance``: ``prune_steps`` (None: a point
            after every head).

    Returns:
        A DataFrame with columns :data:`RUN_COLUMNS` (see the module docstring for each
        experiment's metrics).

    Raises:
        InputError: unknown experiment or option, empty texts, a bad scope or one out of
            range, ``n_permutations < 1``, ``k < 1``, ``eps <= 0``, ``alpha <= 0``, a model
            in training mode, an output the model does not give.
        AttentionUnavailableError / HookNotFiredError: the model's attention cannot be
            reached through the capture seam (the experiment and example are named).
        EditNotAppliedError: a deterministic perturbation changed no weight (not raised by
            permute / dirichlet, which report zero change).

    Example:
        >>> model, tok = ap.load_model("ref:bilstm-classifier")
        >>> table = ap.perturb.run(model, tok, ["the cat sat on the red mat"], "permute")
        >>> table.pivot(index="example_id", columns="metric", values="perturbed")
    """
    spec = _experiment_named(experiment)
    texts = check_texts(texts)
    options = _options(spec.name, spec, params)
    _check_number("n_permutations", n_permutations, integer=True, minimum=1)
    _check_number("seed", seed, integer=True, minimum=0)
    _check_number("k", k, integer=True, minimum=1)
    _check_number("eps (the TVD budget)", eps, integer=False, minimum=0, strict=True)
    _check_number("alpha", alpha, integer=False, minimum=0, strict=True)
    if output not in OUTPUTS:
        raise InputError(one_of("output", output, OUTPUTS))
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be a torch module; got {type(model).__name__}")
    if any(m.training for m in model.modules()):
        raise InputError("the model is in training mode (dropout makes every number random): "
                         "call model.eval()")
    scope = Scope.parse(scope).validate(model)
    job = Job(spec.name, model, tokenizer, texts, scope, Reader("classifier"), n_permutations,
              seed, float(eps), k, float(alpha), target, progress, options)
    first = job.encode(texts[:1])
    with _named(job, "unperturbed forward"), torch.no_grad(), \
            capture(model, layers=scope.layers, heads=scope.heads, keep=False):
        first_output = model(**first)
    reader = _reader(model, output, first_output)
    reader(first_output, first)  # a clear error now when the output does not fit the kind
    job = replace(job, reader=reader)
    rows = spec.fn(job)
    table = pd.DataFrame(
        [(spec.name, r.perturbation, _json(r.params), r.scope, r.example_id, r.step, r.metric,
          r.baseline, r.perturbed, r.perturbed - r.baseline) for r in rows],
        columns=list(RUN_COLUMNS))
    table["step"] = table["step"].astype("Int64")
    for column in ("baseline", "perturbed", "change"):
        table[column] = table[column].astype("float64")
    return table


class _CallableModule(types.ModuleType):
    """``attnprobe.perturb.run`` is both this module and the function: once the submodule is
    imported, Python binds the package attribute ``run`` to the module, so the module calls
    :func:`run` to keep ``ap.perturb.run(...)`` working."""

    def __call__(self, *args: Any, **kwargs: Any) -> pd.DataFrame:
        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
