"""attnprobe: capture, analyse, perturb and report attention heads of any PyTorch model.

``import attnprobe`` needs only torch, numpy and pandas; transformers and friends are imported
when a function needs them.
"""

from attnprobe import heads
from attnprobe.capture import Capture, HookPoint, capture, count_hooks
from attnprobe.errors import (
    AttentionUnavailableError,
    AttnProbeError,
    EditNotAppliedError,
    HookNotFiredError,
    InputError,
    MissingExtraError,
    ModelNotFoundError,
)
from attnprobe.types import (
    AttentionMap,
    ModelInfo,
    TokenAttribution,
    head_id,
    load_maps,
    save_maps,
)

__version__ = "0.1.0"

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
    "TokenAttribution",
    "attribution",
    "capture",
    "count_hooks",
    "extract",
    "head_id",
    "head_stats",
    "heads",
    "load_maps",
    "load_model",
    "perturb",
    "report",
    "save_maps",
]


def __getattr__(name: str):
    # Entry points that need transformers are imported on first use.
    if name in ("load_model", "extract", "head_stats"):
        from attnprobe import extraction

        return getattr(extraction, name)
    if name in ("attribution", "perturb", "report"):
        import importlib

        return importlib.import_module(f"attnprobe.{name}")
    raise AttributeError(f"module 'attnprobe' has no attribute {name!r}")
