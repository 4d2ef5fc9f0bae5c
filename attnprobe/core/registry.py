"""A tiny name -> object registry with helpful errors (one per extension point)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def one_of(kind: str, value: object, valid: list[str] | tuple[str, ...]) -> str:
    """The one-line message for a value that is not among ``valid``."""
    options = ", ".join(repr(v) for v in valid) or "(none registered)"
    return f"unknown {kind} {value!r}; choose one of {options}"


class Registry(Generic[T]):
    """Maps names to objects; duplicate names and unknown look-ups raise."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return add

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return what it held (e.g. a test's temporary entry)."""
        if name not in self._items:
            raise KeyError(one_of(self.kind, name, self.names()))
        return self._items.pop(name)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(one_of(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def values(self) -> list[T]:
        """The registered objects, in the order they were registered."""
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
