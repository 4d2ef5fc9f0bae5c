"""The module-level ``__getattr__`` of a package whose names are imported on first use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_getattr(package: str, lazy: Mapping[str, str]) -> Callable[[str], Any]:
    """Return a ``__getattr__`` for ``package`` that imports ``name`` from its submodule
    ``lazy[name]`` (relative to ``package``) on first use and raises ``AttributeError``
    for any other name."""

    def __getattr__(name: str) -> Any:
        if name in lazy:
            return getattr(import_module(f"{package}.{lazy[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
