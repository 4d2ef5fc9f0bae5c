"""attnprobe: capture, analyse, perturb and report attention heads of any PyTorch model.

``import attnprobe`` needs only torch, numpy and pandas: transformers, captum, spaCy and
matplotlib are imported when a function needs them, and the ``attribution``, ``patch``,
``perturb``, ``plot``, ``report``, ``models`` and ``tasks`` packages load on first use
(``ap.perturb.run``), so that importing attnprobe stays light. ``dir(attnprobe)`` lists every
entry point (without loading them).
"""

from importlib import import_module
from typing import Any

# First of attnprobe's imports: in the `attnprobe` command, Ctrl-C while the ones below load
# (seconds) is one line and exit 130 (attnprobe.core.interrupt; a library import is untouched)
from attnprobe.core import interrupt as _startup  # noqa: F401  (guards on import)

# isort: split
from attnprobe import heads
from attnprobe.capture import Capture, HookPoint, capture, count_hooks, extract, head_stats
from attnprobe.core.scope import Scope
from attnprobe.core.version import __version__
from attnprobe.errors import (
    AttentionUnavailableError,
    AttnProbeError,
    EditNotAppliedError,
    HookNotFiredError,
    InputError,
    MissingExtraError,
    ModelNotFoundError,
)
from attnprobe.loading import load_model
from attnprobe.types import (
    AttentionMap,
    ModelInfo,
    TokenAttribution,
    head_id,
    load_maps,
    save_maps,
)

# Sub-packages loaded on first use (a light `import attnprobe`, not a way around a cycle).
_ON_USE = ("attribution", "faithfulness", "models", "patch", "perturb", "plot", "report", "tasks")
# Modules of the ground floor that are public too (``ap.types.MAP_COLUMNS``, ``ap.errors``).
_MODULES = ("core", "errors", "types")

__all__ = [
    "AttentionMap",
    "AttentionUnavailableError",
    "AttnProbeError",
    "Capture",
    "EditNotAppliedError",
    "HookNotFiredError",
    "HookPoint",
    "InputError",
    "MissingExtraError",
    "ModelInfo",
    "ModelNotFoundError",
    "Scope",
    "TokenAttribution",
    "__version__",
    "attribution",
    "capture",
    "count_hooks",
    "extract",
    "faithfulness",
    "head_id",
    "head_stats",
    "heads",
    "load_maps",
    "load_model",
    "models",
    "patch",
    "perturb",
    "plot",
    "report",
    "save_maps",
    "tasks",
]


def __getattr__(name: str) -> Any:
    if name in _ON_USE:
        return import_module(f"attnprobe.{name}")
    raise AttributeError(f"module 'attnprobe' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (``__all__``, lazy packages included, none imported by listing them),
    the public ground-floor modules and the dunders; no helper imported here."""
    dunders = {name for name in globals() if name.startswith("__")}
    return sorted(set(__all__) | set(_MODULES) | dunders)
