"""The ``importance`` experiment: Michel et al.'s head importance ``E_x |∂L/∂ξ_h|`` of the
scoped heads over the corpus, then the pruning curve in order of increasing importance.

Both are corpus quantities: the gradients are summed per batch and the curve's distances per
batch and point, and the per-batch sums are added in batch order on every process, so a run
split over processes gives the single-process table exactly. Rows about the whole corpus have
``example_id == "all"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.inputs.text import batch_spans
from attnprobe.perturb.budget import Footprint
from attnprobe.perturb.importance import curve_points, head_importance, pruned_outputs
from attnprobe.perturb.job import CORPUS, Job, Row, clean_output, named_errors, register_experiment
from attnprobe.perturb.params import Params, option
from attnprobe.perturb.readout import distances_of, measure
from attnprobe.types import head_id

__all__ = ["ImportanceParams"]

RANK = 40  # after the searches


@dataclass(frozen=True)
class ImportanceParams(Params):
    """Options of ``importance``."""

    prune_steps: int | None = option(None, "points on the pruning curve; none = one after "
                                           "every head", minimum=1)

    def footprint(self, batch_size: int, n_texts: int, seq: int) -> Footprint:
        return Footprint(min(batch_size, n_texts), grad=True)

    def target_unread(self) -> str | None:
        return None  # the loss is -target

    def metric_unread(self) -> str | None:
        return ("it differentiates its target (target=..., the loss) and measures the pruning "
                "curve's distributional change")


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


def _curve(job: Job, order: list[tuple[int, int]], counts: list[int]) -> torch.Tensor:
    """``[point, metric]`` mean over the texts of each distance of :func:`distances_of`
    between the pruned and the unpruned output."""
    metrics = distances_of(job.reader.kind)

    def batch(span: slice) -> torch.Tensor:
        inputs = job.encode(job.texts[span])
        reference, _ = clean_output(job, inputs)
        sums = torch.zeros(len(counts), len(metrics), dtype=torch.float64)
        for point, (_, output) in enumerate(pruned_outputs(job.model, inputs, order, counts)):
            measures = measure(job.reader.kind, reference, job.reader(output, inputs).detach())
            sums[point] = torch.stack([measures[m][1].sum() for m in metrics])
        return sums

    parts = job.sharded(batch, batch_spans(len(job.texts), job.batch_size), unit="batch",
                        desc="perturb importance: pruning curve")
    total = parts[0].clone()
    for part in parts[1:]:  # in batch order, as one process adds them
        total += part
    return total / len(job.texts)


@register_experiment("importance", ImportanceParams, summary=(
    "Michel et al.: head importance E|dL/dxi_h| of the scoped heads over the corpus, and the "
    "pruning curve in order of increasing importance"))
def _importance(job: Job) -> list[Row]:
    """Michel et al.'s head importance and pruning curve, least important heads first."""
    with named_errors(job, "head importance"):
        frame = head_importance(job.model, job.tokenizer, list(job.texts), _loss_fn(job),
                                batch_size=job.batch_size, truncation=job.truncation,
                                max_length=job.max_length, distributed=job.distributed,
                                progress=job.progress)
    inside = [job.scope.contains(layer, head) for layer, head in
              zip(frame["layer"], frame["head"], strict=True)]
    frame = frame[inside]
    rows = []
    estimate = job.record(estimate="gradient", normalised="per layer (l2)")
    for item in frame.itertuples():
        scope = str(Scope(layers=(item.layer,), heads=(item.head,)))
        rows.append(Row("zero", estimate, scope, CORPUS, None, "importance", 0.0,
                        float(item.importance)))
        rows.append(Row("zero", {**estimate, "normalised": "no"}, scope, CORPUS, None,
                        "importance_raw", 0.0, float(item.importance_raw)))
    ranked = frame.sort_values(["importance", "layer", "head"], kind="stable")
    order = list(zip(ranked["layer"].tolist(), ranked["head"].tolist(), strict=True))
    counts = curve_points(len(order), job.params.prune_steps)
    with named_errors(job, "pruning curve"):
        curve = _curve(job, order, counts)
    metrics = distances_of(job.reader.kind)
    decision = job.reader.kind != "embedding"
    scope = str(job.scope)
    for point, n in enumerate(counts):
        params = job.record(order="increasing importance",
                            pruned=[head_id(*h) for h in order[:n]])
        values = dict(zip(metrics, curve[point].tolist(), strict=True))
        if decision:  # the share of texts whose decision did not change
            rows.append(Row("zero", params, scope, CORPUS, n, "agreement", 1.0,
                            1.0 - values["flip"]))
        rows += [Row("zero", params, scope, CORPUS, n, metric, 0.0, value)
                 for metric, value in values.items()]
    return rows
