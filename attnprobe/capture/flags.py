"""The keyword flags of :func:`~attnprobe.capture.capture`: a thin shim over ``parts=``.

``capture(model, scope, parts=[...])`` is the primitive; each flag names one part
(:mod:`attnprobe.capture.parts`, :mod:`attnprobe.capture.rewrites`), so that
``capture(model, scope, keep=False, live=True)`` is ``capture(model, scope, parts=[Live()])``:

=======================  ===============================================================
flag                     part
=======================  ===============================================================
``keep=True``            :class:`~attnprobe.capture.parts.Keep` (the default: without
                         flags and parts a capture keeps the maps; ``keep=False`` drops it)
``reducers=[...]``       :class:`~attnprobe.capture.parts.Reduce` ``(reducers,
                         query_block)``; ``query_block=n`` only with ``reducers``
``edit=fn``              :class:`~attnprobe.capture.rewrites.Edit` ``(fn)``
``edit_output=fn``       :class:`~attnprobe.capture.rewrites.EditOutput` ``(fn)``
``live=True``            :class:`~attnprobe.capture.parts.Live`
``values=True``          :class:`~attnprobe.capture.parts.Values`
``scores=True``          :class:`~attnprobe.capture.parts.Scores`
=======================  ===============================================================

The library itself passes ``parts=``; parts that have no flag (``Activations``,
``Knockout``, ``EditQuery`` ...) are given that way only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from attnprobe.capture.parts import Keep, Live, Part, Reduce, Scores, Values
from attnprobe.capture.rewrites import Edit, EditFn, EditOutput
from attnprobe.core.reducers import Reducer
from attnprobe.errors import InputError

__all__ = ["FLAG_DEFAULTS", "Flags", "given_flags", "parts_from_flags"]


class Flags(TypedDict, total=False):
    """The flags :func:`~attnprobe.capture.capture` takes as keywords (module docstring)."""

    keep: bool | None
    reducers: Sequence[Reducer] | None
    query_block: int | None
    edit: EditFn | None
    edit_output: EditFn | None
    live: bool
    values: bool
    scores: bool


# a flag at its default asks for nothing (keep=None: keep unless parts are given)
FLAG_DEFAULTS: dict[str, Any] = {"keep": None, "reducers": None, "query_block": None,
                                 "edit": None, "edit_output": None, "live": False,
                                 "values": False, "scores": False}


def given_flags(flags: Mapping[str, Any]) -> list[str]:
    """The flags set to something other than their default; TypeError for a keyword that is
    no flag (as Python says it for any other unknown keyword)."""
    unknown = sorted(set(flags) - set(FLAG_DEFAULTS))
    if unknown:
        raise TypeError(f"capture() got an unexpected keyword argument {unknown[0]!r}")
    return [name for name, value in flags.items() if value is not FLAG_DEFAULTS[name]]


def parts_from_flags(flags: Mapping[str, Any]) -> list[Part]:
    """The parts the flags ask for, in the order the capture runs them (edits first, so
    ``keep`` keeps the edited weights)."""
    given_flags(flags)
    value = {**FLAG_DEFAULTS, **flags}
    if value["query_block"] is not None and not value["reducers"]:
        raise InputError("query_block applies to streaming reducers; pass reducers=[...] too")
    parts: list[Part] = []
    if value["edit"] is not None:
        parts.append(Edit(value["edit"]))
    if value["edit_output"] is not None:
        parts.append(EditOutput(value["edit_output"]))
    if value["keep"] is None or value["keep"]:
        parts.append(Keep())
    if value["reducers"]:
        parts.append(Reduce(value["reducers"], value["query_block"]))
    parts += [part() for name, part in (("live", Live), ("values", Values), ("scores", Scores))
              if value[name]]
    return parts
