"""The options of a patching experiment: one frozen parameter dataclass per experiment.

The machinery is :mod:`attnprobe.core.options`: declare each option with
:func:`~attnprobe.core.options.option` (re-exported here with :class:`Params`, so an
experiment's file imports both from this module);
:func:`~attnprobe.core.options.cli_options` makes the flags of ``attnprobe patch``.

What patching keeps for itself: its options are names — a choice among names
(``site="output"``), several of them (``into=("q", "k")``, on the command line and in Python
also ``"q,k"``) or a scope (``senders``) — so the supported types are ``str`` and
``tuple[str, ...]``, each optionally ``| None``; a name is stripped, a value outside
``choices`` names them, and a list names each at most once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from attnprobe.core.options import Options, option
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = ["Params", "option"]


@dataclass(frozen=True)
class Params(Options):
    """Base class of every patching experiment's parameter dataclass (module docstring)."""

    supported: ClassVar[tuple[type, ...]] = (str, tuple)
    family: ClassVar[str] = "patching experiment"

    @classmethod
    def checked(cls, name: str, base: type, metadata: Mapping[str, Any], value: Any) -> Any:
        names = _names(name, value) if base is tuple else (_name(name, value),)
        choices = metadata["choices"]
        for item in names:
            if choices is not None and item not in choices:
                raise InputError(one_of(name.replace("_", " "), item, choices))
        if base is tuple and len(set(names)) < len(names):
            raise InputError(f"{name} names {', '.join(names)}: each at most once")
        return names if base is tuple else names[0]

    @classmethod
    def from_text(cls, name: str, text: str) -> Any:
        return getattr(cls(**{name: text}), name)  # the text is a value in Python too


def _name(option_name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{option_name} must be a name; got {value!r}")
    return value.strip()


def _names(option_name: str, value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    try:
        items = tuple(items)
    except TypeError:
        raise InputError(f"{option_name} must be a name or a list of names; got "
                         f"{value!r}") from None
    if not items:
        raise InputError(f"{option_name} must name at least one; got {value!r}")
    return tuple(_name(option_name, item) for item in items)
