"""What every mergeable result shares: ``sum(parts)`` works (Python's ``sum`` starts from 0),
and two sums over heads merge only when they cover the same heads (an empty one is neutral).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from attnprobe.errors import InputError

__all__ = ["OverHeads", "Summable", "trivial_merge"]


class OverHeads(Protocol):
    heads: Any


T = TypeVar("T", bound=OverHeads)


class Summable:
    """Mixin: ``0 + part`` is ``part``, so ``sum(parts)`` adds parts with their ``__add__``."""

    def __radd__(self, other: object) -> Any:
        if other == 0:
            return self
        return NotImplemented


def trivial_merge(a: T, b: T, what: str) -> T | None:
    """The sum of ``a`` and ``b`` when one of them covers no head (the other), else None;
    sums over different heads are a one-line error naming ``what``."""
    if not a.heads:
        return b
    if not b.heads:
        return a
    if a.heads != b.heads:
        raise InputError(f"cannot merge {what} over different heads")
    return None
