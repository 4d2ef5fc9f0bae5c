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

The class also says what is particular to its experiment, so :func:`~attnprobe.patch.run`
and ``attnprobe patch`` never switch on an experiment's name: the head sites it reads or
rewrites (:meth:`Params.sites`, checked against the model's seam before any forward), the
options that replace ``scope`` (:attr:`Params.instead_of_scope`) and the experiment it
estimates (:attr:`Params.estimates`, what ``--compare`` runs next to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from attnprobe.core.options import Options, option
from attnprobe.core.registry import one_of
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError

__all__ = ["Params", "option"]


@dataclass(frozen=True)
class Params(Options):
    """Base class of every patching experiment's parameter dataclass (module docstring)."""

    supported: ClassVar[tuple[type, ...]] = (str, tuple)
    family: ClassVar[str] = "patching experiment"
    instead_of_scope: ClassVar[tuple[str, ...]] = ()
    """Options that say which heads are patched in place of ``scope`` (path patching:
    ``senders``, ``receivers``); a scope given with them is refused."""
    estimates: ClassVar[str | None] = None
    """The experiment whose table this one estimates (attribution patching: ``heads``), run
    next to it by ``attnprobe patch --compare``."""

    def sites(self) -> list[str]:
        """The head sites (:data:`attnprobe.patch.SITES`) this run reads or rewrites; none by
        default (experiments that hook the model's blocks, e.g. ``residual``)."""
        return []

    def scope_refusal(self, experiment: str, scope: Any) -> str | None:
        """Why ``scope`` cannot be given to ``experiment`` (its heads come from
        :attr:`instead_of_scope`), or ``None``."""
        if not self.instead_of_scope or Scope.parse(scope).is_all:
            return None
        named = " and ".join(f"{name}=" for name in self.instead_of_scope)
        return f"{experiment} patching takes {named} instead of scope="

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
