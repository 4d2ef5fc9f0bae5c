"""The options of a perturbation experiment: one frozen parameter dataclass per experiment.

A parameter class subclasses :class:`Params` and declares each option with :func:`option`
(default, bounds, help text and, optionally, the CLI flag). That one declaration drives

- the validation of :func:`~attnprobe.perturb.experiments.run` (an option the experiment does
  not take is an InputError naming what it takes; numbers are checked with
  :func:`attnprobe.core.checks.check_number`),
- the flags of ``attnprobe perturb`` (:func:`cli_options`, one flag per option name, shared by
  the experiments that take it), and
- the parameter columns of the result table (:meth:`Params.record`; one column per option).

Supported option types: ``int``, ``float``, ``str`` (a spec, e.g. ``knockout``'s edges; with
``takes_callable=True`` a Python callable is taken too and recorded as ``custom``),
``tuple[str, ...]`` (a list of names; a single string is one name; on the command line
comma-separated), each optionally ``| None``.

Example::

    @dataclass(frozen=True)
    class DirichletParams(Params):
        n_draws: int = option(100, "re-draws per text", minimum=1, flag="--draws")
        alpha: float = option(1.0, "concentration", minimum=0, strict=True)
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple

from attnprobe.core.checks import check_number
from attnprobe.errors import InputError
from attnprobe.perturb.budget import Footprint

__all__ = ["SHARED", "CliOption", "Params", "cli_options", "option", "option_flag"]


def option(default: Any, help: str, *, minimum: float | None = None, strict: bool = False,
           flag: str | None = None, takes_callable: bool = False) -> Any:
    """A dataclass field for an experiment option.

    Args:
        default: the value when the option is not given.
        help: one line for ``--help`` and the docs (without the default; it is added).
        minimum / strict: numbers must be ``>= minimum`` (``> minimum`` when ``strict``).
        flag: the command-line flag (default ``--`` + the name with dashes).
        takes_callable: a ``str`` option that also takes a callable (from Python only).
    """
    return field(default=default, metadata={"help": help, "minimum": minimum,
                                            "strict": strict, "flag": flag,
                                            "callable": takes_callable})


def option_flag(name: str, metadata: Any) -> str:
    """The CLI flag of an option: its declared ``flag`` or ``--name-with-dashes``."""
    return metadata.get("flag") or "--" + name.replace("_", "-")


class _Kind(NamedTuple):
    base: type  # int, float, str or tuple (of str)
    optional: bool


@functools.cache
def _kinds(cls: type) -> dict[str, _Kind]:
    """Each option's base type and whether ``None`` is allowed, from the annotations."""
    hints = typing.get_type_hints(cls)
    kinds = {}
    for f in fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        optional = union and type(None) in args
        if optional:
            (hint,) = [a for a in args if a is not type(None)]
        base = typing.get_origin(hint) or hint
        if base not in (int, float, str, tuple):
            raise TypeError(f"{cls.__name__}.{f.name}: option type {hint} is not supported "
                            "(int, float, str, tuple[str, ...], optionally | None)")
        kinds[f.name] = _Kind(base, optional)
    return kinds


@dataclass(frozen=True)
class Params:
    """Base class of every experiment's parameter dataclass (see the module docstring).

    ``seeded``: the experiment draws random numbers, so ``seed`` is recorded with its options.
    """

    seeded: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = _kinds(type(self))[f.name]
            value = getattr(self, f.name)
            if value is None and kind.optional:
                continue
            if kind.base is tuple:
                object.__setattr__(self, f.name, self._names(f.name, value))
                continue
            if kind.base is str:
                self._spec(f.name, value, f.metadata.get("callable", False))
                continue
            minimum = f.metadata["minimum"]
            check_number(f.name, value, integer=kind.base is int,
                         minimum=-float("inf") if minimum is None else minimum,
                         strict=f.metadata["strict"])
            if kind.base is float:
                object.__setattr__(self, f.name, float(value))

    @staticmethod
    def _names(name: str, value: Any) -> tuple[str, ...]:
        items = (value,) if isinstance(value, str) else value
        try:
            items = tuple(items)
        except TypeError:
            raise InputError(f"{name} must be a name or a list of names; got {value!r}") from None
        if not items or not all(isinstance(x, str) and x for x in items):
            raise InputError(f"{name} must be a non-empty list of names; got {value!r}")
        return items

    @staticmethod
    def _spec(name: str, value: Any, takes_callable: bool) -> None:
        if isinstance(value, str) and value.strip():
            return
        if takes_callable and callable(value):
            return
        what = "a non-empty spec string" + (" or a callable" if takes_callable else "")
        raise InputError(f"{name} must be {what}; got {value!r}")

    @classmethod
    def build(cls, experiment: str, given: dict[str, Any]) -> Params:
        """The parameters from ``run()``'s keywords; an option this experiment does not take
        is an InputError that names the experiment and what it takes."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            takes = (f"takes the options {', '.join(names)}" if names
                     else "takes no options of its own")
            raise InputError(f"experiment {experiment!r} {takes} (and the shared ones: "
                             f"{', '.join(SHARED)}); got {', '.join(unknown)}")
        params = cls(**given)
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


@dataclass(frozen=True)
class CliOption:
    """One ``attnprobe perturb`` flag made from the options of that name."""

    flag: str
    name: str  # the run() keyword
    experiments: tuple[str, ...]  # the experiments that take it
    parse: Callable[[str], Any]  # text -> value, InputError with a one-line message
    help: str
    metavar: str


def _parser(cls: type, name: str) -> Callable[[str], Any]:
    kind = _kinds(cls)[name]

    def parse(text: str) -> Any:
        if kind.base is tuple:
            value: Any = [part.strip() for part in text.split(",") if part.strip()]
        elif kind.base is str:
            value = text
        else:
            try:
                value = kind.base(text)
            except ValueError:
                what = "a whole number" if kind.base is int else "a number"
                raise InputError(f"expected {what}; got {text!r}") from None
        cls.build("", {name: value})  # the same checks and messages as run()
        return value

    return parse


def cli_options(experiments: dict[str, type]) -> list[CliOption]:
    """One flag per option name over ``{experiment: params class}``; options that share a
    name must share type, bounds and flag (they are one flag)."""
    found: dict[str, tuple[type, tuple, list[str], list[str]]] = {}
    for experiment, cls in sorted(experiments.items()):
        for f in fields(cls):
            meta = f.metadata
            key = (_kinds(cls)[f.name], meta["minimum"], meta["strict"], meta["flag"])
            if f.name not in found:
                found[f.name] = (cls, key, [experiment], [meta["help"]])
                continue
            _, first_key, owners, helps = found[f.name]
            if first_key != key:
                raise TypeError(f"option {f.name!r} differs between {owners[0]} and "
                                f"{experiment} (type, bounds or flag); one name, one meaning")
            owners.append(experiment)
            if meta["help"] not in helps:
                helps.append(meta["help"])
    options = []
    for name, (cls, _, owners, helps) in found.items():
        f = next(x for x in fields(cls) if x.name == name)
        default = "none" if f.default is None else f.default
        if isinstance(default, tuple):
            default = ",".join(default)
        metavar = {int: "N", float: "X", str: "SPEC",
                   tuple: "NAME[,NAME...]"}[_kinds(cls)[name].base]
        options.append(CliOption(option_flag(name, f.metadata), name, tuple(owners),
                                 _parser(cls, name),
                                 f"{'/'.join(owners)}: {'; '.join(helps)} (default {default})",
                                 metavar))
    return options
