"""What every perturbation experiment shares: the experiment registry, the :class:`Job` an
experiment function receives, the rows it returns, its seeds and its forwards through the
capture seam.

An experiment is ``fn(job) -> list[Row]`` registered with :func:`register_experiment`; the
experiments
live in :mod:`attnprobe.perturb.experiments` (which imports them all, so :data:`EXPERIMENTS` is
complete once that module is imported) and :mod:`attnprobe.perturb.searches`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.capture.text import encode, model_inputs
from attnprobe.core.registry import Registry
from attnprobe.core.scope import Scope
from attnprobe.errors import (
    AttentionUnavailableError,
    EditNotAppliedError,
    HookNotFiredError,
)
from attnprobe.perturb.context import perturbed
from attnprobe.perturb.readout import Reader

__all__ = ["CORPUS", "EXPERIMENTS", "RUN_COLUMNS", "Experiment", "Job"]

RUN_COLUMNS = ("experiment", "perturbation", "params", "scope", "example_id", "step", "metric",
               "baseline", "perturbed", "change")
CORPUS = "all"  # example_id of rows about the whole corpus
STREAMS = {"draws": 0, "erase": 1, "adversarial": 2}  # independent random streams per use


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Experiment:
    """One experiment: ``fn(job) -> rows`` and the extra keyword options it accepts."""

    name: str
    fn: Callable[[Job], list[Row]] = field(repr=False)
    options: Mapping[str, Any] = field(default_factory=dict)


EXPERIMENTS: Registry[Experiment] = Registry("experiment")
COMMON_OPTIONS = MappingProxyType({"batch_size": None, "truncation": False})


def register_experiment(name: str, **options: Any) -> Callable[[Callable], Callable]:
    def add(fn: Callable) -> Callable:
        EXPERIMENTS.register(name)(Experiment(name, fn, MappingProxyType(options)))
        return fn

    return add


# ----------------------------------------------------------------------------- rows and jobs
class Row(NamedTuple):
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
    """Everything an experiment function needs (built and checked by
    :func:`~attnprobe.perturb.experiments.run`)."""

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
        return model_inputs(self.model, batch)

    def examples(self) -> Iterable[tuple[int, str]]:
        items = enumerate(self.texts)
        if not self.progress:
            return items
        from attnprobe.core.optional import require

        return require("tqdm").tqdm(items, total=len(self.texts), unit="text",
                                    desc=f"perturb {self.name}")


def rows_of(measures: Mapping[str, tuple[torch.Tensor, torch.Tensor]], row: int, *,
             perturbation: str, params: dict[str, Any], scope: str, example: str,
             step: int | None = None) -> list[Row]:
    return [Row(perturbation, params, scope, example, step, metric, float(base[row]),
                 float(after[row])) for metric, (base, after) in measures.items()]


# ----------------------------------------------------------------------------- plumbing
def derived_seed(*keys: int) -> int:
    """A seed derived from a tuple of non-negative ints (``(seed, stream, i, j)``)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, dtype=np.uint32)[0])


def generator_for(*keys: int) -> torch.Generator:
    """A CPU generator seeded with :func:`derived_seed` of ``keys``."""
    return torch.Generator().manual_seed(derived_seed(*keys))


def repeat_inputs(inputs: Mapping[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    return {k: v.expand(n, *v.shape[1:]).contiguous() for k, v in inputs.items()}


@contextmanager
def named_errors(job: Job, where: str) -> Iterator[None]:
    """Re-raise capture-seam errors with the experiment and the example in the message."""
    try:
        yield
    except (AttentionUnavailableError, HookNotFiredError, EditNotAppliedError) as exc:
        message = exc.args[0] if exc.args else type(exc).__name__
        raise type(exc)(f"perturb {job.name} ({where}, scope {job.scope}): {message}") from exc


def clean_output(job: Job, inputs: Mapping[str, torch.Tensor], *, keep: bool = False
           ) -> tuple[torch.Tensor, Any]:
    """The unperturbed output vector per example, through the capture seam (as the perturbed
    forwards), and the capture (``keep``: the scoped heads' maps)."""
    with torch.no_grad(), capture(job.model, job.scope,
                                  keep=keep) as cap:
        output = job.model(**inputs)
    return job.reader(output, inputs).detach(), cap


def perturbed_output(job: Job, intervention: Any, inputs: Mapping[str, torch.Tensor]
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
