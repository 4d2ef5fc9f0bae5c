"""The options of a patching experiment: one frozen parameter dataclass per experiment.

Mirrors :mod:`attnprobe.perturb.params` for the option kinds patching needs — a choice among
names (``site="output"``), several of them (``into=("q", "k")``) or a scope (``senders``):
a parameter class subclasses :class:`Params` and declares each option with :func:`option`
(default, help, the names it may take, optionally the CLI flag). That one declaration drives

- the checks of :func:`~attnprobe.patch.experiments.run` (an option the experiment does not
  take is an InputError naming what it takes; a value outside ``choices`` names them), and
- the flags of ``attnprobe patch`` (:func:`cli_options`: one flag per option name, shared by
  the experiments that take it; options of one name must mean the same everywhere).

Supported option types: ``str`` and ``tuple[str, ...]`` (on the command line comma-separated),
each optionally ``| None``.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = ["CliOption", "Params", "cli_options", "option"]


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None,
           flag: str | None = None) -> Any:
    """A dataclass field for an experiment option.

    Args:
        default: the value when the option is not given.
        help: one line for ``--help`` and the docs (without the default; it is added).
        choices: the names the option may take (None: any non-empty string).
        flag: the command-line flag (default ``--`` + the name with dashes).
    """
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag})


def option_flag(name: str, metadata: Any) -> str:
    """The CLI flag of an option: its declared ``flag`` or ``--name-with-dashes``."""
    return metadata.get("flag") or "--" + name.replace("_", "-")


class _Kind(NamedTuple):
    many: bool  # tuple[str, ...] rather than str
    optional: bool


@functools.cache
def _kinds(cls: type) -> dict[str, _Kind]:
    """Each option's kind from the annotations (``str`` or ``tuple[str, ...]``, ``| None``)."""
    hints = typing.get_type_hints(cls)
    kinds = {}
    for f in fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) \
            and type(None) in args
        if optional:
            (hint,) = [a for a in args if a is not type(None)]
        base = typing.get_origin(hint) or hint
        if base not in (str, tuple):
            raise TypeError(f"{cls.__name__}.{f.name}: option type {hint} is not supported "
                            "(str or tuple[str, ...], optionally | None)")
        kinds[f.name] = _Kind(base is tuple, optional)
    return kinds


@dataclass(frozen=True)
class Params:
    """Base class of every patching experiment's parameter dataclass (module docstring)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = _kinds(type(self))[f.name]
            value = getattr(self, f.name)
            if value is None and kind.optional:
                continue
            choices = f.metadata["choices"]
            names = _names(f.name, value) if kind.many else (_name(f.name, value),)
            for name in names:
                if choices is not None and name not in choices:
                    raise InputError(one_of(f.name.replace("_", " "), name, choices))
            if kind.many and len(set(names)) < len(names):
                raise InputError(f"{f.name} names {', '.join(names)}: each at most once")
            object.__setattr__(self, f.name, names if kind.many else names[0])

    @classmethod
    def build(cls, experiment: str, given: dict[str, Any], shared: tuple[str, ...]) -> Params:
        """The parameters from ``run()``'s keywords; an option this experiment does not take
        is an InputError naming the experiment, what it takes and the ``shared`` keywords."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise InputError(f"patching experiment {experiment!r} takes the options "
                             f"{', '.join(names)} (and the shared ones: {', '.join(shared)}); "
                             f"got {', '.join(unknown)}")
        return cls(**given)


def _name(option_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{option_name} must be a name; got {value!r}")
    return value.strip()


def _names(option_name: str, value: Any) -> tuple[str, ...]:
    items = [part for part in value.split(",")] if isinstance(value, str) else value
    try:
        items = tuple(items)
    except TypeError:
        raise InputError(f"{option_name} must be a name or a list of names; got "
                         f"{value!r}") from None
    if not items:
        raise InputError(f"{option_name} must name at least one; got {value!r}")
    return tuple(_name(option_name, item) for item in items)


@dataclass(frozen=True)
class CliOption:
    """One ``attnprobe patch`` flag made from the options of that name."""

    flag: str
    name: str  # the run() keyword
    experiments: tuple[str, ...]  # the experiments that take it
    parse: Callable[[str], Any]  # text -> value, InputError with a one-line message
    help: str
    metavar: str


def _parser(cls: type, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = getattr(cls(**{name: text}), name)  # the same checks and messages as run()
        return value

    return parse


def cli_options(experiments: dict[str, type]) -> list[CliOption]:
    """One flag per option name over ``{experiment: params class}``; options that share a
    name must share kind, choices and flag (they are one flag)."""
    found: dict[str, tuple[type, tuple, list[str], list[str]]] = {}
    for experiment, cls in sorted(experiments.items()):
        for f in fields(cls):
            key = (_kinds(cls)[f.name].many, f.metadata["choices"], f.metadata["flag"])
            if f.name not in found:
                found[f.name] = (cls, key, [experiment], [f.metadata["help"]])
                continue
            _, first_key, owners, helps = found[f.name]
            if first_key != key:
                raise TypeError(f"option {f.name!r} differs between {owners[0]} and "
                                f"{experiment} (kind, choices or flag); one name, one meaning")
            owners.append(experiment)
            if f.metadata["help"] not in helps:
                helps.append(f.metadata["help"])
    options = []
    for name, (cls, key, owners, helps) in found.items():
        f = next(x for x in fields(cls) if x.name == name)
        default = "none" if f.default is None else f.default
        if isinstance(default, tuple):
            default = ",".join(default)
        many, choices, _ = key
        metavar = "|".join(choices) if choices else "SCOPE" if not many else "NAME[,NAME...]"
        if many and choices:
            metavar = f"{{{','.join(choices)}}}[,...]"
        options.append(CliOption(option_flag(name, f.metadata), name, tuple(owners),
                                 _parser(cls, name),
                                 f"{'/'.join(owners)}: {'; '.join(helps)} (default {default})",
                                 metavar))
    return options
