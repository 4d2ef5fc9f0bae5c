"""What every perturbation experiment shares: the experiment registry, the :class:`Job` an
experiment function receives, the rows it returns, its seeds, its forwards through the capture
seam, and its share of the texts when the work is split over processes.

An experiment is one function ``fn(job) -> list[Row]`` and one parameter dataclass (a
:class:`~attnprobe.perturb.params.Params`), registered together with a one-line summary by
:func:`register_experiment` in a module of :mod:`attnprobe.perturb`. The modules are
discovered (:class:`~attnprobe.core.experiments.ExperimentRegistry`: every module of the
package is imported, in declared ``RANK`` order, the first time :data:`EXPERIMENTS` is
read), so adding an experiment touches one file: its module, which declares ``RANK`` and
builds on the public helpers here (:func:`clean_output`, :func:`perturbed_output`,
:func:`rows_of`, :func:`named_errors`, :meth:`Job.per_text`, :meth:`Job.sharded`) and on
:func:`attnprobe.perturb.draws.per_text_draws` / :func:`attnprobe.perturb.edits.one_shot` for
the two common shapes (``N`` random draws per text; one edit per text batch, with sweeps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from torch import nn

from attnprobe.capture import Keep, capture
from attnprobe.core.experiments import (
    Experiment,
    ExperimentRegistry,
    Sharded,
    experiment_registrar,
)
from attnprobe.core.options import Options
from attnprobe.core.scope import Scope
from attnprobe.errors import (
    AttentionUnavailableError,
    EditNotAppliedError,
    HookNotFiredError,
)
from attnprobe.inputs.text import Text, encode, model_inputs
from attnprobe.perturb.context import perturbed
from attnprobe.perturb.params import SHARED, Params
from attnprobe.perturb.readout import Reader, measure
from attnprobe.perturb.scoring import Scalar
from attnprobe.perturb.table import RUN_COLUMNS

__all__ = ["CORPUS", "EXPERIMENTS", "RUN_COLUMNS", "SWEEPS", "Experiment", "Job", "Row",
           "register_experiment"]

SWEEPS = ("head", "layer")  # run(sweep=...): each head, or each layer, of the scope alone
CORPUS = "all"  # example_id of rows about the whole corpus
STREAMS = {"draws": 0, "erase": 1, "adversarial": 2}  # independent random streams per use

# ----------------------------------------------------------------------------- registry
EXPERIMENTS = ExperimentRegistry("experiment", "attnprobe.perturb")


def _runnable(name: str, params: type[Options]) -> None:
    taken = sorted({f.name for f in fields(params)} & set(SHARED))
    if taken:  # run() takes these keywords itself: such an option could never be given
        raise TypeError(f"experiment {name!r}: options {taken} are shared run() keywords")
    named = sorted({f.name for f in fields(params)} & set(RUN_COLUMNS))
    if named:  # each option is a column of the table, next to these
        raise TypeError(f"experiment {name!r}: options {named} are table columns")


register_experiment = experiment_registrar(EXPERIMENTS, Params, check=_runnable)
"""``@register_experiment(name, params=Params, *, summary, sweeps=False)`` on ``fn(job) ->
list[Row]``: experiment ``name`` with its parameter dataclass and its one-line ``summary``
(``--help``, the README); ``sweeps``: it also runs ``run(sweep="head" | "layer")`` (``fn``
then reads ``job.sweep``). An option named like a shared ``run()`` keyword or a table column
is a TypeError at registration."""


# ----------------------------------------------------------------------------- rows and jobs
class Row(NamedTuple):
    """One row of the table (:mod:`attnprobe.perturb.table`): ``params`` become the parameter
    columns, ``scope`` (a :class:`Scope` or its string) gives ``scope``, ``layer``, ``head``."""

    perturbation: str
    params: dict[str, Any]
    scope: Scope | str
    example_id: str
    step: int | None
    metric: str
    baseline: float
    perturbed: float


@dataclass(frozen=True, eq=False)
class Job(Sharded):
    """Everything an experiment function needs (built and checked by
    :func:`~attnprobe.perturb.experiments.run`). ``ids[i]`` is the index of ``texts[i]`` in
    the caller's list (texts left out by ``truncation="skip"`` have none), so every seed and
    ``example_id`` derives from it, however the texts are batched or split over processes."""

    name: str
    model: nn.Module
    tokenizer: Any
    texts: tuple[Text, ...]  # strings or token ids
    ids: tuple[int, ...]
    scope: Scope
    reader: Reader
    params: Any  # the experiment's Params subclass
    seed: int
    target: Any
    batch_size: int
    truncation: str  # "error" or "cut" (skipped texts are already left out)
    max_length: int | None
    progress: bool
    distributed: bool | None
    sweep: str | None = None  # "head" / "layer": each unit of the scope alone (SWEEPS)
    scalar: Scalar | None = None  # a scalar metric (perturb.scoring); None: the reader's change

    family: ClassVar[str] = "perturb"  # progress bars read "perturb <name>"
    unit: ClassVar[str] = "text"

    def encode(self, texts: Sequence[Text]) -> dict[str, torch.Tensor]:
        batch = encode(self.model, self.tokenizer, texts, truncation=self.truncation,
                       max_length=self.max_length)
        return model_inputs(self.model, batch)

    def examples(self) -> list[tuple[int, str]]:
        """``(id, text)`` of every text."""
        return list(zip(self.ids, self.texts, strict=True))

    def record(self, **extra: Any) -> dict[str, Any]:
        """The ``params`` of a row: the experiment's options, the seed when it draws, where a
        scalar metric reads (``positions``), and what is particular to the row."""
        seed = {"seed": self.seed} if self.params.seeded else {}
        where = self.scalar.record() if self.scalar is not None else {}
        return {**self.params.record(), **seed, **where, **extra}

    def read(self, output: Any, inputs: Mapping[str, torch.Tensor],
             rows: Sequence[int] | None = None) -> torch.Tensor:
        """What is compared of one forward's output: the scalar metric ``[batch]`` or the
        reader's vector ``[batch, classes | vocab | dim]``; ``rows[r]`` is the caller's index
        of batch row ``r``'s text (per-text metric positions)."""
        if self.scalar is not None:
            return self.scalar.read(output, inputs, rows)
        return self.reader(output, inputs).detach()

    def compare(self, before: torch.Tensor, after: torch.Tensor
                ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{metric: (baseline, perturbed)}`` per batch row, ``[batch]`` each."""
        if self.scalar is not None:
            return self.scalar.compare(before, after)
        return measure(self.reader.kind, before, after)

    def per_text(self, fn: Callable[[int, str], list[Row]]) -> list[Row]:
        """``fn(id, text)`` for every text, sharded; the rows in text order."""
        parts = self.sharded(lambda item: fn(*item), self.examples())
        return [row for part in parts for row in part]


def rows_of(measures: Mapping[str, tuple[torch.Tensor, torch.Tensor]], row: int, *,
            perturbation: str, params: dict[str, Any], scope: Scope | str, example: str,
            step: int | None = None) -> list[Row]:
    """One :class:`Row` per metric of :meth:`Job.compare`'s ``measures`` (``{metric:
    (baseline [batch], perturbed [batch])}``), read at batch row ``row``."""
    return [Row(perturbation, params, scope, example, step, metric, float(base[row]),
                float(after[row])) for metric, (base, after) in measures.items()]


# ----------------------------------------------------------------------------- plumbing
def derived_seed(*keys: int) -> int:
    """A seed derived from a tuple of non-negative ints (``(seed, stream, i, j)``)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, dtype=np.uint32)[0])


def generator_for(*keys: int) -> torch.Generator:
    """A CPU generator seeded with :func:`derived_seed` of ``keys``."""
    return torch.Generator().manual_seed(derived_seed(*keys))


@contextmanager
def named_errors(job: Job, where: str) -> Iterator[None]:
    """Re-raise capture-seam errors with the experiment and the example in the message."""
    try:
        yield
    except (AttentionUnavailableError, HookNotFiredError, EditNotAppliedError) as exc:
        message = exc.args[0] if exc.args else type(exc).__name__
        raise type(exc)(f"perturb {job.name} ({where}, scope {job.scope}): {message}") from exc


def clean_output(job: Job, inputs: Mapping[str, torch.Tensor], *, keep: bool = False,
                 rows: Sequence[int] | None = None) -> tuple[torch.Tensor, Any]:
    """What is compared of the unperturbed output (:meth:`Job.read`), through the capture seam
    (as the perturbed forwards), and the capture (``keep``: the scoped heads' maps)."""
    with torch.no_grad(), capture(job.model, job.scope, parts=[Keep()] if keep else []) as cap:
        output = job.model(**inputs)
    return job.read(output, inputs, rows), cap


def perturbed_output(job: Job, intervention: Any, inputs: Mapping[str, torch.Tensor],
                     rows: Sequence[int] | None = None) -> torch.Tensor:
    try:
        with torch.no_grad(), perturbed(job.model, intervention, job.scope, seed=job.seed):
            output = job.model(**inputs)
    except EditNotAppliedError as exc:
        raise EditNotAppliedError(
            f"{intervention.name} changed no attention weight: every scoped row already looks "
            "the way it would make it (e.g. uniform, or all weight on one key); choose another "
            f"scope or drop the text ({exc})") from exc
    return job.read(output, inputs, rows)
