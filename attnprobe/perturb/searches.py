"""The perturbation experiments that search: ``erase`` (keys erased in ranked order until the
decision flips), ``adversarial`` (the most different attention within ε of the output) and
``importance`` (heads scored by gradient, then pruned least important first).

Each is registered in :data:`~attnprobe.perturb.experiments.EXPERIMENTS`; call them through
:func:`~attnprobe.perturb.experiments.run`, whose docstring lists their options and metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from attnprobe.capture.info import attention_sizes
from attnprobe.core.registry import one_of
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.perturb.adversarial import adversarial_attention
from attnprobe.perturb.importance import head_importance, pruning_curve
from attnprobe.perturb.interventions import Erase
from attnprobe.perturb.job import (
    CORPUS,
    STREAMS,
    Job,
    Row,
    clean_output,
    derived_seed,
    generator_for,
    named_errors,
    perturbed_output,
    register_experiment,
    repeat_inputs,
    rows_of,
)
from attnprobe.perturb.readout import Reader, distances_of, mean_row_max, measure, row_max_sums
from attnprobe.types import head_id

DEFAULT_RANKINGS = ("attention", "integrated_gradients", "random")


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


@register_experiment("erase", rankings=DEFAULT_RANKINGS, n_steps=50)
def _erase(job: Job) -> list[Row]:
    """Serrano & Smith's erasure in attention, attribution and random order."""
    rankings = _check_rankings(job.options["rankings"])
    decision = job.reader.kind != "embedding"
    scope = str(job.scope)
    rows = []
    for i, text in job.examples():
        inputs = job.encode([text])
        example = str(i)
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
        last = n - 1 if decision else min(job.k, n - 1)  # at most n - 1 of the n keys
        for ranking in rankings:
            if ranking == "attention":
                order = keys[received[keys].argsort(descending=True, stable=True)]
            elif ranking == "random":
                draw = torch.randperm(n, generator=generator_for(job.seed, STREAMS["erase"], i))
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
                with named_errors(job, where):
                    parts.append(perturbed_output(job, Erase(keys=chunk),
                                                   repeat_inputs(inputs, chunk.shape[0])))
            after = torch.cat(parts)
            measures = measure(job.reader.kind, before, after)
            for j in range(1, min(job.k, last) + 1):
                rows += rows_of(measures, j - 1, perturbation="erase",
                                 params={"k": j, "ranking": ranking}, scope=scope,
                                 example=example, step=j)
            if decision:
                flips = (after.argmax(-1) != before.argmax(-1)).nonzero().flatten()
                first = int(flips[0]) + 1 if len(flips) else None
                params = {"n_keys": n, "ranking": ranking}
                rows.append(Row("erase", params, scope, example, None, "flipped", 0.0,
                                 float(first is not None)))
                rows.append(Row("erase", params, scope, example, None, "fraction_to_flip",
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


@register_experiment("adversarial", n_adversaries=5, steps=500, lr=0.01)
def _adversarial(job: Job) -> list[Row]:
    """Jain & Wallace's adversarial attention per example and scoped layer."""
    n_layers, n_heads = attention_sizes(job.model)
    layers = job.scope.layers_in(n_layers)
    opts = {name: job.options[name] for name in ("n_adversaries", "steps", "lr")}
    rows = []
    for i, text in job.examples():
        inputs = job.encode([text])
        with named_errors(job, f"example {i}"):
            before, _ = clean_output(job, inputs)
        fn = _probabilities(job.reader, before)
        for layer in layers:
            with named_errors(job, f"example {i}, layer {layer}"):
                found = adversarial_attention(
                    job.model, inputs, layer=layer, heads=job.scope.heads_of(layer, n_heads),
                    output_fn=fn, eps=job.eps,
                    seed=derived_seed(job.seed, STREAMS["adversarial"], i, layer),
                    **opts)
            jsd = torch.tensor(found.jsd, dtype=torch.float64)
            tvd = torch.tensor(found.tvd, dtype=torch.float64)
            within = tvd <= found.eps
            best = int(torch.where(within, jsd, -1.0).argmax()) if bool(within.any()) \
                else int(tvd.argmin())
            max_before = mean_row_max(*row_max_sums(found.original[None], found.original[None]))
            max_after = mean_row_max(*row_max_sums(found.attention[best][None],
                                                found.original[None]))
            params = {"eps": found.eps, **opts, "seed": job.seed}
            scoped = job.scope.heads_of(layer, n_heads)
            row_scope = str(Scope(layers=(layer,)) if len(scoped) == n_heads
                            else Scope(layers=(layer,), heads=scoped))
            example = str(i)
            for metric, base, value in (
                    ("jsd", 0.0, float(jsd[best]) if bool(within.any()) else math.nan),
                    ("tvd", 0.0, float(tvd[best])),
                    ("within_eps", 1.0, float(bool(within.any()))),
                    ("max_attention", float(max_before[0]), float(max_after[0]))):
                rows.append(Row("adversarial", params, row_scope, example, None, metric,
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


@register_experiment("importance", prune_steps=None)
def _importance(job: Job) -> list[Row]:
    """Michel et al.'s head importance and pruning curve, least important heads first."""
    with named_errors(job, "head importance"):
        frame = head_importance(job.model, job.tokenizer, job.texts, _loss_fn(job),
                                batch_size=job.batch_size or 8)
    inside = [job.scope.contains(layer, head) for layer, head in
              zip(frame["layer"], frame["head"], strict=True)]
    frame = frame[inside]
    rows = []
    estimate = {"estimate": "gradient", "normalised": "per layer (l2)"}
    for item in frame.itertuples():
        scope = str(Scope(layers=(item.layer,), heads=(item.head,)))
        rows.append(Row("zero", estimate, scope, CORPUS, None, "importance", 0.0,
                         float(item.importance)))
        rows.append(Row("zero", {**estimate, "normalised": "no"}, scope, CORPUS, None,
                         "importance_raw", 0.0, float(item.importance_raw)))
    order = frame.sort_values(["importance", "layer", "head"], kind="stable")
    order = list(zip(order["layer"].tolist(), order["head"].tolist(), strict=True))
    points: list[dict[str, float]] = []
    reference: list[torch.Tensor] = []

    def metric_fn(output: Any, inputs: Mapping[str, torch.Tensor]) -> float:
        values = job.reader(output, inputs).detach()
        if not reference:
            reference.append(values)
        measures = measure(job.reader.kind, reference[0], values)
        point = {m: float(after.mean()) for m, (_, after) in measures.items()
                 if m in distances_of(job.reader.kind)}
        if job.reader.kind != "embedding":
            point = {"agreement": 1.0 - point["flip"], **point}
        points.append(point)
        return next(iter(point.values()))

    with named_errors(job, "pruning curve"):
        curve = pruning_curve(job.model, job.tokenizer, job.texts, metric_fn, order,
                              steps=job.options["prune_steps"])
    scope = str(job.scope)
    for n, point in zip(curve["n_pruned"].tolist(), points, strict=True):
        if n == 0:
            continue
        params = {"order": "increasing importance", "pruned": [head_id(*h) for h in order[:n]]}
        for metric, value in point.items():
            base = points[0][metric]
            rows.append(Row("zero", params, scope, CORPUS, int(n), metric, base, value))
    return rows
