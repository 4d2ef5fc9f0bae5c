"""How a model is placed when it is loaded: precision, device, device map, memory caps, offload
folder and quantized weights, checked before anything is read from disk.

:class:`LoadOptions` is what :func:`attnprobe.load_model` and every command's ``--dtype``,
``--device``, ``--device-map``, ``--max-memory``, ``--offload-folder`` and ``--quantization``
fill in. :meth:`LoadOptions.checked` refuses, with one line naming the fix, a device that does
not exist, an unknown dtype, a quantization back-end that is not installed, an offload folder
that cannot be written and a memory cap below one layer (:func:`check_fits`); what passes is
turned into ``from_pretrained`` keywords by :meth:`LoadOptions.from_pretrained_keywords`.

The placement itself is accelerate's (``device_map``, ``max_memory``, ``offload_folder``) and
the quantization the back-end's that transformers drives: optimum-quanto for ``int8`` / ``int4``
on the CPU, bitsandbytes for ``int8`` / ``nf4`` on CUDA (:data:`QUANTIZATIONS`). Each is an
optional extra of attnprobe (``attnprobe[big]``, ``attnprobe[quanto]``, ``attnprobe[bnb]``).
"""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from attnprobe.core.devices import check_device_map, check_exists, offloads, parse_device
from attnprobe.core.optional import require
from attnprobe.core.registry import Registry
from attnprobe.errors import InputError, MissingExtraError, OutputError

__all__ = ["DEVICE_MAPS", "DTYPES", "QUANTIZATIONS", "LoadOptions", "LoadWarning", "Quantization",
           "check_fits", "dtype_names", "parse_max_memory", "parse_size", "size_text"]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}
"""Names a dtype may be given by (``--dtype bf16``)."""

def dtype_names() -> list[str]:
    """The first name of each dtype of :data:`DTYPES` (the other spellings are accepted too).

    Example:
        >>> dtype_names()
        ['fp32', 'bf16', 'fp16']
    """
    first: dict[torch.dtype, str] = {}
    for name, dtype in DTYPES.items():
        first.setdefault(dtype, name)
    return list(first.values())


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's placement strategies; a device map may also be a JSON file or a dict."""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class LoadWarning(UserWarning):
    """A note on how a model is being loaded (:attr:`LoadOptions.warnings`: fp16 on the CPU),
    its own category so that a command loading two models the same way says it once."""


@dataclass(frozen=True)
class Quantization:
    """One ``--quantization`` value: which back-end serves it on which device."""

    name: str
    bits: int
    summary: str
    config: Callable[[torch.device], Any]
    """``device -> transformers quantization config`` (raises for a device it cannot serve)."""


QUANTIZATIONS: Registry[Quantization] = Registry("quantization")


def _quanto(weights: str) -> Callable[[torch.device], Any]:
    def config(device: torch.device) -> Any:
        if device.type == "cuda" and weights == "int8":
            return _bitsandbytes(load_in_8bit=True)
        _need("optimum.quanto", "optimum-quanto", "quanto", f"--quantization {weights}")
        return require("transformers").QuantoConfig(weights=weights)
    return config


def _bitsandbytes(**keywords: Any) -> Any:
    _need("bitsandbytes", "bitsandbytes", "bnb", "8-bit/4-bit weights on CUDA")
    return require("transformers").BitsAndBytesConfig(**keywords)


def _nf4(device: torch.device) -> Any:
    if device.type != "cuda":
        raise InputError("--quantization nf4 needs bitsandbytes on a CUDA device; on "
                         f"{device.type} use int8 or int4 (optimum-quanto)")
    return _bitsandbytes(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                         bnb_4bit_compute_dtype=torch.bfloat16)


for _entry in (Quantization("int8", 8, "int8 weights, per-row scales (optimum-quanto on the "
                            "CPU, bitsandbytes LLM.int8 on CUDA)", _quanto("int8")),
               Quantization("int4", 4, "int4 weights, grouped scales (optimum-quanto)",
                            _quanto("int4")),
               Quantization("nf4", 4, "4-bit NormalFloat weights (bitsandbytes, CUDA)", _nf4)):
    QUANTIZATIONS.register(_entry.name)(_entry)


def _need(module: str, package: str, extra: str, what: str) -> None:
    try:
        require(module)
    except MissingExtraError:
        raise MissingExtraError(f"{what} needs {package}: pip install 'attnprobe[{extra}]'"
                                ) from None


def parse_size(text: str | int) -> int:
    """``"20GiB"`` / ``"500MB"`` / ``"1.5GB"`` / ``1000`` -> bytes.

    Example:
        >>> parse_size("1.5GiB"), parse_size("500MB"), parse_size(4096)
        (1610612736, 500000000, 4096)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if found is None or found.group(2).lower() not in _UNITS:
            raise InputError(f"cannot read the memory size {text!r}: write e.g. 20GiB, "
                             "500MB or a number of bytes")
        size = int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    if size <= 0:
        raise InputError(f"a memory size must be > 0; got {text!r}")
    return size


def parse_max_memory(spec: str | Mapping[Any, Any]) -> dict[int | str, int]:
    """``"0=20GiB,cpu=60GiB"`` (or a dict) -> ``{0: bytes, "cpu": bytes}``: GPU indices,
    ``cpu``, ``mps`` or ``disk`` as keys.

    Example:
        >>> parse_max_memory("0=20GiB,cpu=60GiB")
        {0: 21474836480, 'cpu': 64424509440}
    """
    if isinstance(spec, str):
        pairs = [part.split("=", 1) for part in spec.split(",") if part.strip()]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise InputError(f"cannot read --max-memory {spec!r}: write DEVICE=SIZE pairs, "
                             "e.g. 0=20GiB,cpu=60GiB")
        items = [(key.strip(), value.strip()) for key, value in pairs]
    else:
        items = list(spec.items())
    caps: dict[int | str, int] = {}
    for key, value in items:
        name: int | str = int(key) if str(key).isdigit() else str(key).strip().lower()
        if isinstance(name, str) and name not in ("cpu", "mps", "disk"):
            raise InputError(f"max_memory key {key!r} is not a device: use a GPU index "
                             "(0, 1 ...), cpu, mps or disk")
        caps[name] = parse_size(value)
    return caps


@dataclass(frozen=True)
class LoadOptions:
    """Where and how a checkpoint is loaded (module docstring); None keeps the default:
    float32 (the checkpoint's dtype for a quantized load) on the CPU, all in memory.

    Attributes:
        dtype: a name of :data:`DTYPES` or a ``torch.dtype``.
        device: ``cpu``, ``cuda``, ``cuda:1``, ``mps``: the whole model on one device.
        device_map: one of :data:`DEVICE_MAPS`, a JSON file of ``{module: device}``, or that
            dict (``"disk"`` offloads a module to ``offload_folder``).
        max_memory: ``"0=20GiB,cpu=60GiB"`` or ``{0: "20GiB", "cpu": "60GiB"}``: what the
            placement may use per device (implies ``device_map="auto"``).
        offload_folder: where offloaded weights go (implies ``device_map="auto"``).
        quantization: a name of :data:`QUANTIZATIONS` (``int8``, ``int4``, ``nf4``).
    """

    dtype: str | torch.dtype | None = None
    device: str | torch.device | None = None
    device_map: str | Path | Mapping[str, Any] | None = None
    max_memory: str | Mapping[Any, Any] | None = None
    offload_folder: str | Path | None = None
    quantization: str | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_default(self) -> bool:
        return self == LoadOptions()

    @property
    def torch_dtype(self) -> torch.dtype | None:
        if self.dtype is None or isinstance(self.dtype, torch.dtype):
            return self.dtype
        return DTYPES[str(self.dtype).lower()]

    def checked(self) -> LoadOptions:
        """These options validated and normalised (module docstring), before any loading.

        Raises:
            InputError / OutputError / MissingExtraError: one line naming the fix.
        """
        dtype = self._dtype()
        device = parse_device(self.device) if self.device is not None else None
        device_map = self._device_map()
        caps = parse_max_memory(self.max_memory) if self.max_memory is not None else None
        for key in caps or ():
            if isinstance(key, int):
                check_exists(torch.device("cuda", key))
            elif key == "mps":
                check_exists(torch.device("mps"))
        implied = [name for name, given in (("--max-memory", caps),
                                            ("--offload-folder", self.offload_folder))
                   if given is not None and device_map is None]
        if implied:
            device_map = "auto"  # a cap or an offload folder only means something to a map
        if device is not None and device_map is not None:
            spread = " / ".join(implied) + " (which place the model with --device-map auto)" \
                if implied else "--device-map"
            raise InputError("give either --device (the whole model on one device) or "
                             f"{spread} (spread over devices), not both")
        if caps is not None and isinstance(device_map, dict):
            # accelerate uses a {module: device} map as given: the cap would be ignored
            raise InputError("--max-memory caps an automatic placement (--device-map "
                             f"{' / '.join(DEVICE_MAPS)}); a map that names each module's "
                             "device is used as given, so the cap would be ignored: drop one "
                             "of them")
        if device_map is not None:
            _need("accelerate", "accelerate", "big", "--device-map / --max-memory / "
                  "--offload-folder")
        if self.quantization is not None:
            config = self.quantizer(device or _first_device(device_map, caps))
            if isinstance(device_map, dict) and offloads(device_map) and \
                    isinstance(config, require("transformers").QuantoConfig):
                raise InputError(f"--quantization {self.quantization} (optimum-quanto) "
                                 "quantizes the weights as they load and cannot offload them "
                                 "to the CPU or disk: map every module to one device, or load "
                                 "without --quantization")
        folder = self._offload_folder()
        notes = []
        if dtype == torch.float16 and (device is None or device.type == "cpu") \
                and device_map is None:
            notes.append("fp16 matrix products on the CPU may be slow (CPUs seldom have fp16 "
                          "kernels); bf16 or fp32 run faster there")
        if dtype == torch.bfloat16 and device is not None and device.type == "cuda" \
                and not torch.cuda.is_bf16_supported():
            raise InputError(f"{device} cannot compute in bf16; use --dtype fp16 or fp32")
        return replace(self, dtype=dtype, device=device, device_map=device_map,
                       max_memory=caps, offload_folder=folder, warnings=tuple(notes))

    def quantizer(self, device: torch.device) -> Any:
        """The transformers quantization config of :attr:`quantization` for ``device``."""
        name = str(self.quantization).lower()
        if name not in QUANTIZATIONS:
            raise InputError(f"unknown quantization {self.quantization!r}; choose one of "
                             f"{', '.join(QUANTIZATIONS.names())}")
        return QUANTIZATIONS.get(name).config(device)

    def from_pretrained_keywords(self) -> dict[str, Any]:
        """The keywords ``from_pretrained`` takes for these (checked) options."""
        keywords: dict[str, Any] = {}
        if self.dtype is not None:
            keywords["dtype"] = self.torch_dtype
        if self.device is not None and torch.device(self.device).type != "cpu":
            keywords["device_map"] = {"": torch.device(self.device)}
        if self.device_map is not None:
            keywords["device_map"] = self.device_map
        if self.max_memory is not None:
            keywords["max_memory"] = dict(self.max_memory)
        if self.offload_folder is not None:
            keywords["offload_folder"] = str(self.offload_folder)
        if self.quantization is not None:
            device = torch.device(self.device) if self.device is not None else \
                _first_device(self.device_map, self.max_memory)
            keywords["quantization_config"] = self.quantizer(device)
        return keywords

    def _dtype(self) -> torch.dtype | None:
        if self.dtype is None or isinstance(self.dtype, torch.dtype):
            if isinstance(self.dtype, torch.dtype) and self.dtype not in DTYPES.values():
                raise InputError(f"dtype {self.dtype} cannot run a model here; use bf16, fp16 "
                                 "or fp32")
            return self.dtype
        name = str(self.dtype).lower()
        if name not in DTYPES:
            raise InputError(f"unknown dtype {self.dtype!r}; choose bf16, fp16 or fp32")
        return DTYPES[name]

    def _device_map(self) -> str | dict[str, Any] | None:
        spec = self.device_map
        if spec is None or isinstance(spec, Mapping):
            return check_device_map(dict(spec)) if spec is not None else None
        if str(spec) in DEVICE_MAPS:
            return str(spec)
        path = Path(spec).expanduser()
        if not path.is_file():
            raise InputError(f"--device-map {str(spec)!r} is neither one of "
                             f"{', '.join(DEVICE_MAPS)} nor a JSON file")
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the device map {path}: {exc}") from None
        if not isinstance(found, dict) or not found:
            raise InputError(f"{path} must hold a JSON object {{module: device}}")
        return check_device_map(found)

    def _offload_folder(self) -> Path | None:
        """The offload folder, checked writable without creating it: a refused load leaves
        nothing behind (the loader creates it just before the weights are placed)."""
        if self.offload_folder is None:
            return None
        folder = Path(self.offload_folder).expanduser().absolute()
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        try:
            if not existing.is_dir():
                raise NotADirectoryError(20, "a file stands in the way", str(existing))
            with tempfile.NamedTemporaryFile(dir=existing):
                pass
        except OSError as exc:
            raise OutputError(f"the offload folder {folder} is not writable "
                              f"({exc.strerror or exc}); give a folder you can write to"
                              ) from None
        return folder


def _first_device(device_map: Any, caps: Mapping[Any, int] | None) -> torch.device:
    """The device a map computes on first: a GPU if the map or the caps name one."""
    names = list(caps or ()) + (list(device_map.values()) if isinstance(device_map, dict)
                                else [])
    if any(isinstance(n, int) or str(n).startswith("cuda") for n in names) or (
            device_map in DEVICE_MAPS and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def check_fits(config: Any, options: LoadOptions) -> None:
    """Refuse a ``max_memory`` below one layer: every device the map may compute on needs
    room for the largest block the placement will not split (``_no_split_modules``), in the
    load's dtype (or quantized width). Builds the model on the meta device (no weights).

    Raises:
        InputError: no device of ``max_memory`` (disk aside) can hold one layer.

    Example:
        >>> check_fits(model.config, LoadOptions(max_memory="cpu=64MiB").checked())  # room
        >>> check_fits(model.config, LoadOptions(max_memory="cpu=1MiB").checked())
        Traceback (most recent call last):
        attnprobe.errors.InputError: max_memory (cpu=1.0 MiB) is smaller than ...
    """
    caps = {k: v for k, v in (options.max_memory or {}).items() if k != "disk"}
    if not caps:
        return
    transformers, accelerate = require("transformers"), require("accelerate")
    with accelerate.init_empty_weights(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skeleton = transformers.AutoModel.from_config(config)
    blocks = set(getattr(skeleton, "_no_split_modules", None) or ())
    sizes = [sum(p.numel() for p in m.parameters()) for m in skeleton.modules()
             if type(m).__name__ in blocks] or [max(
                 sum(p.numel() for p in m.parameters(recurse=False)) for m in skeleton.modules())]
    if options.quantization is not None:
        bits = QUANTIZATIONS.get(str(options.quantization).lower()).bits
    else:  # float32 unless asked, whatever the checkpoint holds (as the loader loads it)
        bits = torch.finfo(options.torch_dtype or torch.float32).bits
    layer = max(sizes) * bits // 8
    if max(caps.values()) < layer:
        shown = ", ".join(f"{k}={size_text(v)}" for k, v in caps.items())
        raise InputError(f"max_memory ({shown}) is smaller than one layer of the model "
                         f"({size_text(layer)} at {bits} bits): allow at least that much on "
                         "one device")


def size_text(size: int) -> str:
    """Bytes as a short binary size (``"1.5 GiB"``).

    Example:
        >>> size_text(3 * 2**30), size_text(1536)
        ('3.0 GiB', '1.5 KiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
