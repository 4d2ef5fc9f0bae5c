"""What every patching experiment shares: the registry, the :class:`Job` an experiment receives,
its runs of the clean and corrupted inputs, its patched forwards, and its share of the work when
split over the ranks of a ``torch.distributed`` group.

An experiment is one function ``fn(job) -> pd.DataFrame`` and one parameter dataclass
(:class:`~attnprobe.patch.params.Params`), registered together with a one-line summary by
:func:`register_experiment` in a module of :mod:`attnprobe.patch` that declares its ``RANK``.
The modules are discovered (:class:`~attnprobe.core.experiments.ExperimentRegistry`) the
first time :data:`EXPERIMENTS` is read, so adding an experiment touches one file; what it
needs beyond its own forwards is here (:meth:`Job.runs`, :meth:`Job.patched`,
:meth:`Job.measure`, :meth:`Job.baselines`, :meth:`Job.sharded`), and what it reads or
refuses is said by its parameter class (:meth:`~attnprobe.patch.params.Params.sites`,
:attr:`~attnprobe.patch.params.Params.instead_of_scope`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.capture.parts import Part
from attnprobe.core.experiments import (
    Experiment,
    ExperimentRegistry,
    Sharded,
    experiment_registrar,
)
from attnprobe.core.metric import Metric
from attnprobe.core.scope import Scope
from attnprobe.errors import EditNotAppliedError
from attnprobe.patch.pairs import MetricPlan, Pairs, rows_of
from attnprobe.patch.params import Params
from attnprobe.patch.sites import readers, tensors_of
from attnprobe.patch.table import check_differs

__all__ = ["EXPERIMENTS", "Baselines", "Experiment", "Hooks", "Job", "Runs",
           "register_experiment"]

Acts = dict[str, dict[int, torch.Tensor]]  # tensor name -> layer -> [batch, head, pos, ...]
Hooks = Callable[[slice, str], AbstractContextManager[Any]]  # (span, run name) -> context


EXPERIMENTS = ExperimentRegistry("patching experiment", "attnprobe.patch")

register_experiment = experiment_registrar(EXPERIMENTS, Params)
"""``@register_experiment(name, params, *, summary)`` on ``fn(job) -> table``: experiment
``name`` with its parameter dataclass and its one-line ``summary`` (``--help``, the
README)."""


@dataclass(frozen=True)
class Baselines:
    """The metric of the clean and corrupted run of every example ``[example]``, the note on
    examples where they are equal (None: none), and per layer the heads along each read
    tensor's head axis (``{layer: {"q": 4, "k": 2}}``)."""

    clean: np.ndarray
    corrupt: np.ndarray
    note: str | None
    sizes: dict[int, dict[str, int]]


@dataclass
class Runs:
    """The clean and corrupted runs of one batch of examples (``span`` of the pairs).

    ``inputs`` / ``acts`` / ``output`` per run name (``"clean"``, ``"corrupt"``); ``acts``
    holds the read tensors per layer ``[batch, head, position, ...]``; ``values`` the metric
    of each example ``[batch]`` (float64, CPU); ``metric`` the metric built for the batch
    (``next-token`` fixed on the clean run).
    """

    span: slice
    inputs: dict[str, dict[str, torch.Tensor]]
    acts: dict[str, Acts]
    values: dict[str, torch.Tensor]
    metric: Metric


@dataclass
class Job(Sharded):
    """Everything an experiment needs (built and checked by :func:`~attnprobe.patch.run`)."""

    name: str
    model: nn.Module
    tokenizer: Any
    pairs: Pairs
    plan: MetricPlan
    scope: Scope
    direction: str
    params: Params
    batch_size: int
    progress: bool
    distributed: bool | None
    _cache: dict[tuple[int, int, tuple[str, ...], Scope], Runs] = field(default_factory=dict,
                                                                        repr=False)

    family: ClassVar[str] = "patch"  # progress bars read "patch <name>: ..."

    # ------------------------------------------------------------ the two inputs
    @property
    def base(self) -> str:
        """The run that is patched: the corrupted one when denoising, the clean one when
        noising."""
        return "corrupt" if self.direction == "denoising" else "clean"

    @property
    def other(self) -> str:
        """The run the activations come from."""
        return "clean" if self.direction == "denoising" else "corrupt"

    def runs(self, span: slice, scope: Scope, tensors: Sequence[str],
             hooks: Hooks | None = None) -> Runs:
        """The clean and corrupted runs of ``span`` through the capture seam with ``scope``
        (its layers run the eager attention the patched forwards run), reading ``tensors``;
        ``hooks(span, run)``, when given, is a context entered around each run (e.g. to read
        MLP outputs). The last one is kept (the metric check and the patches ask for the same
        batch)."""
        key = (span.start, span.stop, tuple(tensors), scope)
        if key in self._cache:
            return self._cache[key]
        clean, corrupt = self.pairs.encoded(self.model, self.tokenizer, span)
        inputs = {"clean": clean, "corrupt": corrupt}
        width = clean["input_ids"].shape[1]
        metric = self.plan.build(self.pairs.index[span], width)
        acts: dict[str, Acts] = {}
        values: dict[str, torch.Tensor] = {}
        for name in ("clean", "corrupt"):  # clean first: next-token is fixed on it
            with (hooks(span, name) if hooks is not None else nullcontext()):
                output, acts[name] = self.read(inputs[name], scope, tensors)
            if name == "clean":
                metric = metric.fixed(output, inputs[name])
            values[name] = self.plan.values(metric, output, inputs[name])
        self._cache.clear()
        found = self._cache[key] = Runs(span, inputs, acts, values, metric)
        return found

    def read(self, inputs: dict[str, torch.Tensor], scope: Scope, tensors: Sequence[str],
             *, grad: bool = False) -> tuple[Any, Acts]:
        """One forward reading ``tensors`` of the scoped layers: ``(output, acts)``."""
        parts = readers(tensors, grad=grad) or readers(["pattern"])
        with (torch.enable_grad() if grad else torch.no_grad()), \
                capture(self.model, scope, parts=parts) as cap:
            output = self.model(**inputs)
        return output, {t: tensors_of(cap, t) for t in tensors}

    def patched(self, inputs: dict[str, torch.Tensor], scope: Scope, parts: Sequence[Part],
                *, stop_early: bool = False) -> tuple[Any, Any]:
        """A forward with rewriting ``parts``: ``(output, capture)``; ``capture`` is None when
        no rewrite changed anything (every patch copied an activation equal in both runs: the
        output is then the base run's, a measurement, not an error). ``stop_early``: end the
        forward after the last scoped layer (the output is then None)."""
        output = None
        try:
            with torch.no_grad(), capture(self.model, scope, parts=list(parts),
                                          stop_early=stop_early) as cap:
                output = self.model(**inputs)
        except EditNotAppliedError:
            return output, None
        return output, cap

    def measure(self, metric: Metric, output: Any, inputs: dict[str, torch.Tensor],
                copies: int) -> np.ndarray:
        """``[copies, batch]``: the metric of each repetition of the examples in a forward of
        ``copies · batch`` rows (row ``k·b + t``: example ``t``)."""
        b = inputs["input_ids"].shape[0]
        return np.stack([self.plan.values(metric, rows_of(output, slice(k * b, (k + 1) * b),
                                                          copies * b), inputs).numpy()
                         for k in range(copies)])

    # ------------------------------------------------------------ the metric check
    def baselines(self, spans: Sequence[slice], scope: Scope, tensors: Sequence[str],
                  hooks: Hooks | None = None) -> Baselines:
        """The clean and corrupted runs of every span (sharded): their metrics, checked to
        differ (:func:`~attnprobe.patch.table.check_differs`) before any patch runs, and the
        heads along each read tensor's head axis per layer."""
        def one(span: slice) -> tuple[np.ndarray, np.ndarray, dict[int, dict[str, int]]]:
            found = self.runs(span, scope, tensors, hooks)
            sizes: dict[int, dict[str, int]] = {}
            for name, layers in found.acts["clean"].items():
                for layer, tensor in layers.items():
                    sizes.setdefault(layer, {})[name] = int(tensor.shape[1])
            return found.values["clean"].numpy(), found.values["corrupt"].numpy(), sizes

        parts = self.sharded(one, spans, desc=f"patch {self.name}: clean and corrupted runs")
        clean = np.concatenate([p[0] for p in parts])
        corrupt = np.concatenate([p[1] for p in parts])
        note = check_differs(clean, corrupt, self.pairs.ids, self.plan.name)
        return Baselines(clean, corrupt, note, parts[0][2])
