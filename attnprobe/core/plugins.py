"""Discovery of extension modules: a folder of modules is imported whole, so registering an
extension is writing one module there — no import list to keep.

Each module may declare ``RANK`` (an int, default :data:`DEFAULT_RANK`): modules are imported
in (rank, name) order, which is the order their registrations take (e.g. the order of the
census's statistics). A module whose name starts with ``_`` or that is listed in ``skip`` is
not imported (helpers, bases).

Example:
    >>> [m.__name__ for m in import_modules("attnprobe.heads.stats", skip=("base",))][:2]
    ['attnprobe.heads.stats.rows', 'attnprobe.heads.stats.offsets']
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["DEFAULT_RANK", "declared_rank", "discover", "import_modules"]

DEFAULT_RANK = 100


def declared_rank(path: Path) -> int:
    """The ``RANK = <int>`` a module file declares at top level (read without importing it:
    the order must be known before any registration runs), else :data:`DEFAULT_RANK`."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "RANK"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)):
            return node.value.value
    return DEFAULT_RANK


def import_modules(package: str, *, skip: Sequence[str] = ()) -> list[ModuleType]:
    """Import every module of ``package`` (not sub-packages), in (declared rank, name) order.

    Args:
        package: a dotted package name, e.g. ``"attnprobe.perturb"``.
        skip: module names (last part) that are not extensions (bases, shared helpers).

    Returns:
        The imported modules, in import order.
    """
    root = importlib.import_module(package)
    found = []
    for info in pkgutil.iter_modules(root.__path__):
        if info.ispkg or info.name.startswith("_") or info.name in skip:
            continue
        # the folder that holds it: a package may span several (__path__), e.g. a test's
        path = Path(getattr(info.module_finder, "path", root.__path__[0])) / f"{info.name}.py"
        rank = declared_rank(path) if path.exists() else DEFAULT_RANK
        found.append((rank, info.name))
    return [importlib.import_module(f"{package}.{name}") for _, name in sorted(found)]


_DISCOVERED: set[tuple[str, tuple[str, ...]]] = set()  # (package, its search path) imported


def discover(package: str, *, skip: Sequence[str] = ()) -> None:
    """:func:`import_modules` once per search path, for registries asked on every call (a
    metric spec parsed per batch): a later call is a set look-up, unless the package's
    ``__path__`` changed (a test adding a folder of modules).

    Example:
        >>> discover("attnprobe.core.metric_kinds")    # the metric kinds are registered
    """
    key = (package, tuple(importlib.import_module(package).__path__))
    if key not in _DISCOVERED:
        import_modules(package, skip=skip)
        _DISCOVERED.add(key)
