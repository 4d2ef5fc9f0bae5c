"""One machinery for registered experiments, shared by perturbation (:mod:`attnprobe.perturb`)
and patching (:mod:`attnprobe.patch`).

An experiment is a function ``fn(job) -> rows | table`` and a parameter dataclass (an
:class:`~attnprobe.core.options.Options` family), registered together with a one-line
summary by the family's ``register_experiment`` (made by :func:`experiment_registrar`). Each
family keeps its own :class:`ExperimentRegistry` and its own ``Job``; what they share is here:

- the :class:`Experiment` record (name, function, parameter class, summary, rank, sweeps);
- :class:`ExperimentRegistry`, which *discovers* its experiments: the first time it is read,
  every module of the family's package is imported in (declared ``RANK``, name) order
  (:func:`~attnprobe.core.plugins.import_modules`), so adding an experiment is writing one
  module there — no import list to keep;
- :class:`Sharded`, the part of a ``Job`` that splits its units over the ranks of a
  ``torch.distributed`` group (with a progress bar);
- :func:`experiment_lines`, the one-line-per-experiment text the CLI's help, the README's
  generated tables and the docs are written from.

Example:
    >>> EXPERIMENTS = ExperimentRegistry("experiment", "my_package.experiments")
    >>> register_experiment = experiment_registrar(EXPERIMENTS, MyParams)
    >>> @register_experiment("shuffle", summary="every scoped row shuffled once")
    ... def _shuffle(job): ...
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from attnprobe.core.distributed import run_sharded
from attnprobe.core.options import Options
from attnprobe.core.plugins import DEFAULT_RANK, import_modules
from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError

__all__ = ["Experiment", "ExperimentRegistry", "Sharded", "experiment_lines",
           "experiment_registrar"]

U = TypeVar("U")
R = TypeVar("R")


@dataclass(frozen=True)
class Experiment:
    """One registered experiment.

    Attributes:
        name: what ``run(..., experiment=name)`` and ``--experiment`` take.
        fn: ``fn(job)``: the rows (perturbation) or the table (patching) of one run.
        params: its parameter dataclass (its options, their defaults, checks and help).
        summary: one line for ``--help``, the README and the docs.
        rank: the ``RANK`` its module declares (order of listings; ties: registration order).
        sweeps: it also runs one unit of the scope at a time (perturbation's ``sweep=``).
    """

    name: str
    fn: Callable[[Any], Any] = field(repr=False)
    params: type[Options]
    summary: str
    rank: int = DEFAULT_RANK
    sweeps: bool = False


class ExperimentRegistry(Registry[Experiment]):
    """A family's experiments, discovered from the modules of ``package`` on first read.

    Registering never triggers discovery (the modules register while they are imported);
    every read does, once. :meth:`values` is in (rank, registration) order, :meth:`names`
    alphabetical, as for every registry.
    """

    def __init__(self, kind: str, package: str) -> None:
        super().__init__(kind)
        self.package = package
        self._discovered = False

    def discover(self) -> None:
        """Import every module of the package (again: a module added since, e.g. on a
        widened ``__path__``, registers now; imported ones are not re-run)."""
        self._discovered = True  # first: a module read while importing must not recurse
        import_modules(self.package)

    def _complete(self) -> None:
        if not self._discovered:
            self.discover()

    def get(self, name: str) -> Experiment:
        self._complete()
        return super().get(name)

    def names(self) -> list[str]:
        self._complete()
        return super().names()

    def values(self) -> list[Experiment]:
        """The experiments in (rank, registration) order."""
        self._complete()
        return sorted(super().values(), key=lambda spec: spec.rank)

    def __contains__(self, name: object) -> bool:
        self._complete()
        return super().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._complete()
        return super().__len__()

    def named(self, name: Any) -> Experiment:
        """The experiment ``name``; an InputError naming the choices otherwise."""
        if isinstance(name, str) and name in self:
            return self.get(name)
        raise InputError(one_of(self.kind, name, self.names()))


def experiment_registrar(registry: ExperimentRegistry, base: type[Options], *,
                         check: Callable[[str, type[Options]], None] | None = None
                         ) -> Callable[..., Callable[[Callable], Callable]]:
    """The ``register_experiment`` decorator factory of a family.

    Args:
        registry: where the experiments go.
        base: the family's parameter base class (the default ``params``: no own options).
        check: ``check(name, params)`` raises TypeError for a parameter class the family
            cannot run (e.g. an option named like a shared ``run()`` keyword).

    Returns:
        ``register_experiment(name, params=base, *, summary, sweeps=False)``, a decorator
        of ``fn(job)``; the experiment's rank is the ``RANK`` of ``fn``'s module.
    """
    def register_experiment(name: str, params: type[Options] = base, *, summary: str,
                            sweeps: bool = False) -> Callable[[Callable], Callable]:
        if not issubclass(params, base):
            raise TypeError(f"{registry.kind} {name!r}: params must subclass "
                            f"{base.__module__}.{base.__name__}")
        if not summary.strip() or "\n" in summary:
            raise TypeError(f"{registry.kind} {name!r}: summary must be one non-empty line")
        if check is not None:
            check(name, params)

        def add(fn: Callable) -> Callable:
            module = sys.modules.get(fn.__module__)
            rank = getattr(module, "RANK", DEFAULT_RANK)
            registry.register(name)(Experiment(name, fn, params, summary.strip(), rank, sweeps))
            return fn

        return add

    return register_experiment


def experiment_lines(registry: ExperimentRegistry, *, width: int = 92,
                     indent: str = "  ") -> str:
    """``name: summary`` per experiment in rank order, each indented by ``indent`` and
    wrapped to ``width`` (continuation lines indented twice): the list ``--help`` prints."""
    return "\n".join(textwrap.fill(f"{spec.name}: {spec.summary}", width,
                                   initial_indent=indent, subsequent_indent=indent * 2)
                     for spec in registry.values())


class Sharded:
    """The sharding of a family's ``Job`` (a mixin): the job's units split over the ranks of
    a ``torch.distributed`` group, every rank getting every result in unit order.

    A ``Job`` using it has ``name``, ``progress`` and ``distributed`` attributes; the family
    sets :attr:`family` (``"perturb"``) and its default :attr:`unit`.
    """

    family: ClassVar[str] = "experiment"
    unit: ClassVar[str] = "batch"
    name: str
    progress: bool
    distributed: bool | None

    def sharded(self, fn: Callable[[U], R], units: Sequence[U], *, unit: str | None = None,
                desc: str = "") -> list[R]:
        """``[fn(u) for u in units]``, split over the ranks when distributed, with a
        progress bar when asked for (``desc``, default ``"<family> <name>"``)."""
        return run_sharded(fn, units, distributed=self.distributed, progress=self.progress,
                           desc=desc or f"{self.family} {self.name}", unit=unit or self.unit)
