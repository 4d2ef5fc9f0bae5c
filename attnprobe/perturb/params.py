"""The options of a perturbation experiment: one frozen parameter dataclass per experiment.

The machinery is :mod:`attnprobe.core.options`: a parameter class subclasses :class:`Params`
and declares each option with :func:`~attnprobe.core.options.option` (re-exported here: an
experiment's file imports both from this module; default, bounds, help text and, optionally,
the CLI flag). That one declaration drives

- the validation of :func:`~attnprobe.perturb.experiments.run` (an option the experiment does
  not take is an InputError naming what it takes; numbers are checked with
  :func:`attnprobe.core.checks.check_number`),
- the flags of ``attnprobe perturb`` (:func:`~attnprobe.core.options.cli_options`, one flag
  per option name, shared by the experiments that take it), and
- the parameter columns of the result table (:meth:`Params.record`; one column per option).

What perturbation keeps for itself: ``str`` options are specs (e.g. ``knockout``'s edges; with
``takes_callable=True`` a Python callable is taken too and recorded as ``custom``),
``tuple[str, ...]`` is a list of names (a single string is one name; on the command line
comma-separated); options that would change nothing given the others are refused
(:meth:`Params.idle`); and each experiment says what it reads (a target, a metric) and needs.

Example::

    @dataclass(frozen=True)
    class DirichletParams(Params):
        n_draws: int = option(100, "re-draws per text", minimum=1, flag="--draws")
        alpha: float = option(1.0, "concentration", minimum=0, strict=True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from attnprobe.core.options import Options, option
from attnprobe.errors import InputError
from attnprobe.perturb.budget import Footprint

__all__ = ["SHARED", "Params", "option"]

P = TypeVar("P", bound="Params")


@dataclass(frozen=True)
class Params(Options):
    """Base class of every experiment's parameter dataclass (see the module docstring).

    ``seeded``: the experiment draws random numbers, so ``seed`` is recorded with its options.
    """

    seeded: ClassVar[bool] = False

    @classmethod
    def checked(cls, name: str, base: type, metadata: Mapping[str, Any], value: Any) -> Any:
        if base is tuple:
            return _names(name, value)
        if base is str:
            _spec(name, value, metadata["callable"])
            return value
        return super().checked(name, base, metadata, value)

    @classmethod
    def build(cls: type[P], experiment: str, given: Mapping[str, Any],
              shared: Sequence[str] = ()) -> P:
        """The parameters from ``run()``'s keywords; an option this experiment does not take
        is an InputError that names the experiment and what it takes, and so is an option
        given explicitly that would change nothing (:meth:`idle`)."""
        params = super().build(experiment, given, shared or SHARED)  # type: ignore[misc]
        idle = params.idle()
        for name in sorted(set(given) & set(idle)):
            raise InputError(f"experiment {experiment!r}: {name} changes nothing here "
                             f"({idle[name]}); leave it out")
        return params

    def idle(self) -> dict[str, str]:
        """Options that have no effect given the others (``{name: why}``), e.g. ``erase``'s
        ``n_steps`` without an Integrated Gradients ranking: given explicitly, they are an
        InputError rather than silently ignored. None by default."""
        return {}

    def target_unread(self) -> str | None:
        """Why this experiment, with these options, reads no ``target`` (``run()`` then refuses
        one), or ``None`` when it reads it. By default it measures the whole output."""
        return "it measures the change of the whole output, not of a target"

    def metric_unread(self) -> str | None:
        """Why this experiment, with these options, cannot measure a scalar ``metric``
        (``run()`` then refuses one), or ``None`` when it can. By default it can: the metric
        is read on the unperturbed and the perturbed output of every example."""
        return None

    def missing(self) -> str | None:
        """What must still be given before a run (a required option left out), or ``None``.
        ``run()`` refuses the run with this message before the first forward."""
        return None

    def footprint(self, batch_size: int, n_texts: int, seq: int) -> Footprint:
        """What a run over ``n_texts`` texts of at most ``seq`` tokens needs (see
        :mod:`attnprobe.perturb.budget`): the rows a forward will really have, by default
        ``batch_size`` texts (never more than there are), and nothing held."""
        return Footprint(min(batch_size, n_texts))

    def record(self) -> dict[str, Any]:
        """The options as a dict (names lists, callables ``"custom"``), for the table's
        parameter columns."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple)
                else "custom" if callable(v) else v
                for f in fields(self)}


# the keywords every experiment takes (run()'s signature), for messages
SHARED = ("scope", "batch_size", "truncation", "seed", "progress", "output", "target",
          "metric", "positions", "max_length", "distributed", "sweep")


def _names(name: str, value: Any) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    try:
        items = tuple(items)
    except TypeError:
        raise InputError(f"{name} must be a name or a list of names; got {value!r}") from None
    if not items or not all(isinstance(x, str) and x for x in items):
        raise InputError(f"{name} must be a non-empty list of names; got {value!r}")
    return items


def _spec(name: str, value: Any, takes_callable: bool) -> None:
    if isinstance(value, str) and value.strip():
        return
    if takes_callable and callable(value):
        return
    what = "a non-empty spec string" + (" or a callable" if takes_callable else "")
    raise InputError(f"{name} must be {what}; got {value!r}")
