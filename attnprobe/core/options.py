"""The options of registered experiments: one frozen parameter dataclass per experiment.

A family of experiments (perturbations, patching) subclasses :class:`Options` once, and each
experiment's parameter class subclasses that, declaring every option with :func:`option`
(default, help, the names it may take or its bounds, optionally the CLI flag). That one
declaration drives

- the checks of the family's ``run()`` (:meth:`Options.build`: an option the experiment does
  not take is an InputError naming what it takes; each value goes through the family's
  :meth:`Options.checked`), and
- the flags of its command (:func:`cli_options`: one flag per option name, shared by the
  experiments that take it, parsed with the checks of ``run()``). Options of one name must
  mean the same everywhere: one name, one flag.

What a family keeps for itself: the option types it supports (:attr:`Options.supported`, from
``int``, ``float``, ``str``, ``tuple[str, ...]``, each optionally ``| None``), how it checks a
name or a list of names, and how it reads one from the command line
(:meth:`Options.from_text`).

Example::

    @dataclass(frozen=True)
    class DirichletParams(Params):  # attnprobe.perturb.params.Params, an Options family
        n_draws: int = option(100, "re-draws per text", minimum=1, flag="--draws")
        alpha: float = option(1.0, "concentration", minimum=0, strict=True)
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple, TypeVar

from attnprobe.core.checks import check_number
from attnprobe.errors import InputError

__all__ = ["CliOption", "Kind", "Options", "cli_options", "kinds", "option", "option_flag",
           "registered_options"]

OptionsT = TypeVar("OptionsT", bound="Options")
METAVARS = {int: "N", float: "X", str: "SPEC", tuple: "NAME[,NAME...]"}  # by option type


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None,
           minimum: float | None = None, strict: bool = False, flag: str | None = None,
           metavar: str | None = None, takes_callable: bool = False) -> Any:
    """A dataclass field for an experiment option.

    Args:
        default: the value when the option is not given.
        help: one line for ``--help`` and the docs, without the default and without the names
            of the experiments that take it (both are added).
        choices: the names a ``str`` option (or each name of a ``tuple``) may take.
        minimum / strict: numbers must be ``>= minimum`` (``> minimum`` when ``strict``).
        flag: the command-line flag (default ``--`` + the name with dashes).
        metavar: what ``--help`` shows for the value (default: by type and choices).
        takes_callable: a ``str`` option that also takes a callable (from Python only).

    Example:
        >>> share = option(0.5, "share of the weight kept", minimum=0, strict=True)  # a field
        >>> share.default, share.metadata["minimum"]  # (0.5, 0)
        >>> ap.perturb.params_of("dirichlet")(alpha=2).alpha  # 2.0; alpha=0 is an InputError
    """
    return field(default=default, metadata={
        "help": help, "choices": choices, "minimum": minimum, "strict": strict, "flag": flag,
        "metavar": metavar, "callable": takes_callable})


def option_flag(name: str, metadata: Mapping[str, Any]) -> str:
    """The CLI flag of an option: its declared ``flag`` or ``--name-with-dashes``.

    Example:
        >>> option_flag("n_draws", {"flag": None})  # '--n-draws'
    """
    return metadata.get("flag") or "--" + name.replace("_", "-")


class Kind(NamedTuple):
    """An option's type, read off its annotation."""

    base: type  # int, float, str or tuple (of str)
    optional: bool  # ``| None``: None is a value


@functools.cache
def kinds(cls: type[Options]) -> dict[str, Kind]:
    """Each option's :class:`Kind` from the annotations of ``cls``; a type the family does
    not support (:attr:`Options.supported`) is a TypeError when the class is first used."""
    hints = typing.get_type_hints(cls)
    found = {}
    for f in fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) \
            and type(None) in args
        if optional:
            (hint,) = [a for a in args if a is not type(None)]
        base = typing.get_origin(hint) or hint
        if base not in cls.supported:
            names = ", ".join("tuple[str, ...]" if t is tuple else t.__name__
                              for t in cls.supported)
            raise TypeError(f"{cls.__name__}.{f.name}: option type {hint} is not supported "
                            f"({names}, optionally | None)")
        found[f.name] = Kind(base, optional)
    return found


@dataclass(frozen=True)
class Options:
    """Base class of a family of parameter dataclasses (module docstring).

    ``supported``: the option types of the family; ``family``: how its messages name an
    experiment (``"experiment"``, ``"patching experiment"``).
    """

    supported: ClassVar[tuple[type, ...]] = (int, float, str, tuple)
    family: ClassVar[str] = "experiment"

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = kinds(type(self))[f.name]
            value = getattr(self, f.name)
            if value is None and kind.optional:
                continue
            object.__setattr__(self, f.name, self.checked(f.name, kind.base, f.metadata, value))

    @classmethod
    def checked(cls, name: str, base: type, metadata: Mapping[str, Any], value: Any) -> Any:
        """The value of option ``name`` as the instance keeps it, or an InputError with a
        one-line message. Numbers are checked against their bounds here (floats kept as
        ``float``); a family checks its names (``str``, ``tuple``) itself."""
        if base in (int, float):
            minimum = metadata["minimum"]
            check_number(name, value, integer=base is int,
                         minimum=-float("inf") if minimum is None else minimum,
                         strict=metadata["strict"])
            return float(value) if base is float else value
        raise TypeError(f"{cls.__name__} does not check {base.__name__} options")

    @classmethod
    def build(cls: type[OptionsT], experiment: str, given: Mapping[str, Any],
              shared: Sequence[str] = ()) -> OptionsT:
        """The parameters from ``run()``'s keywords; an option this experiment does not take
        is an InputError naming the experiment, what it takes and the ``shared`` keywords."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            takes = (f"takes the options {', '.join(names)}" if names
                     else "takes no options of its own")
            raise InputError(f"{cls.family} {experiment!r} {takes} (and the shared ones: "
                             f"{', '.join(shared)}); got {', '.join(unknown)}")
        return cls(**given)

    @classmethod
    def from_text(cls, name: str, text: str) -> Any:
        """Option ``name`` from its command-line text (numbers parsed, lists comma-separated),
        with the checks and messages of ``run()``."""
        base = kinds(cls)[name].base
        value: Any = text
        if base is tuple:
            value = [part.strip() for part in text.split(",") if part.strip()]
        elif base in (int, float):
            try:
                value = base(text)
            except ValueError:
                what = "a whole number" if base is int else "a number"
                raise InputError(f"expected {what}; got {text!r}") from None
        return getattr(cls.build("", {name: value}), name)


@dataclass(frozen=True)
class CliOption:
    """One command-line flag made from the options of that name."""

    flag: str
    name: str  # the run() keyword
    experiments: tuple[str, ...]  # the experiments that take it
    parse: Callable[[str], Any]  # text -> value, InputError with a one-line message
    help: str
    metavar: str


def _metavar(kind: Kind, metadata: Mapping[str, Any]) -> str:
    choices = metadata["choices"]
    if metadata["metavar"]:
        return metadata["metavar"]
    if choices and kind.base is tuple:
        return f"{{{','.join(choices)}}}[,...]"
    return "|".join(choices) if choices else METAVARS[kind.base]


def cli_options(experiments: Mapping[str, type[Options]]) -> list[CliOption]:
    """One flag per option name over ``{experiment: params class}``, its help naming the
    experiments that take it. Options that share a name must share type, choices, bounds and
    flag (they are one flag), and a help may not name an experiment itself: both are a
    TypeError.

    Example:
        >>> draws, alpha = cli_options({"dirichlet": ap.perturb.params_of("dirichlet")})
        >>> draws.flag, draws.parse("20"), alpha.help  # --draws, 20, 'dirichlet: ...'
    """
    found: dict[str, tuple[type[Options], tuple, list[str], list[str]]] = {}
    for experiment, cls in sorted(experiments.items()):
        for f in fields(cls):
            meta = f.metadata
            if meta["help"].startswith(f"{experiment}:"):
                raise TypeError(f"{experiment}: the help of option {f.name!r} starts with the "
                                "experiment's name; --help adds the experiments that take it")
            key = (kinds(cls)[f.name], meta["choices"], meta["minimum"], meta["strict"],
                   meta["flag"])
            if f.name not in found:
                found[f.name] = (cls, key, [experiment], [meta["help"]])
                continue
            _, first_key, owners, helps = found[f.name]
            if first_key != key:
                raise TypeError(f"option {f.name!r} differs between {owners[0]} and "
                                f"{experiment} (type, choices, bounds or flag); one name, one "
                                "meaning")
            owners.append(experiment)
            if meta["help"] not in helps:
                helps.append(meta["help"])
    options = []
    for name, (cls, _, owners, helps) in found.items():
        f = next(x for x in fields(cls) if x.name == name)
        default = "none" if f.default is None else f.default
        if isinstance(default, tuple):
            default = ",".join(default)
        options.append(CliOption(option_flag(name, f.metadata), name, tuple(owners),
                                 functools.partial(cls.from_text, name),
                                 f"{'/'.join(owners)}: {'; '.join(helps)} (default {default})",
                                 _metavar(kinds(cls)[name], f.metadata)))
    return options


def registered_options(experiments: Iterable[Any]) -> list[CliOption]:
    """:func:`cli_options` of every experiment in a registry (entries with ``name`` and
    ``params``, e.g. ``attnprobe.perturb.EXPERIMENTS.values()``).

    Example:
        >>> [o.flag for o in registered_options(ap.patch.EXPERIMENTS.values())]
    """
    return cli_options({spec.name: spec.params for spec in experiments})
