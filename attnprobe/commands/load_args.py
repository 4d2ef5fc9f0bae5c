"""The model options every command shares: ``--model`` and how it is loaded (``--dtype``,
``--device``, ``--device-map``, ``--max-memory``, ``--offload-folder``, ``--quantization``),
turned into :func:`attnprobe.load_model` keywords by :func:`load_options_of`.

The values are checked where the Python API checks them
(:meth:`attnprobe.load_options.LoadOptions.checked`, before anything is read), so a bad one
is the same one-line error in both; only the spellings argparse can judge alone (the choices
of ``--dtype`` and ``--quantization``, the syntax of ``--max-memory``) are refused while the
command line is parsed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnprobe.errors import InputError
from attnprobe.load_options import (
    DEVICE_MAPS,
    DTYPES,
    QUANTIZATIONS,
    dtype_names,
    parse_max_memory,
)

__all__ = ["LOAD_OPTIONS", "load_args", "load_options_of", "model_args"]

MODEL_HELP = ("minilm (default), ref:<name>, a local HF model directory or a hub id in your "
              "HuggingFace cache")
LOAD_OPTIONS = ("dtype", "device", "device_map", "max_memory", "offload_folder", "quantization")
"""The ``load_model`` keywords the options fill in (argparse ``dest`` names)."""


def _max_memory(text: str) -> str:
    """``--max-memory``: its syntax checked now (one line), the string kept for the loader."""
    try:
        parse_max_memory(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def model_args(parser: argparse.ArgumentParser, model_help: str = MODEL_HELP) -> None:
    """``--model`` and the loading options (:func:`load_args`)."""
    parser.add_argument("--model", default="minilm", help=model_help)
    load_args(parser)


def load_args(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` ... ``--quantization``: where and how ``--model`` is loaded."""
    group = parser.add_argument_group("loading (big models)")
    group.add_argument("--dtype", choices=list(DTYPES), metavar="|".join(dtype_names()),
                       help="precision of the weights (default fp32; fp16 is slow on CPUs)")
    group.add_argument("--device", metavar="cpu|cuda|cuda:1|mps",
                       help="put the whole model on this device")
    group.add_argument("--device-map", metavar=f"{'|'.join(DEVICE_MAPS[:2])}|FILE.json",
                       help="spread the model over devices (accelerate); a JSON file maps "
                            "modules to devices, 'disk' offloads to --offload-folder")
    group.add_argument("--max-memory", type=_max_memory, metavar="0=20GiB,cpu=60GiB",
                       help="memory the placement may use per device (implies --device-map "
                            "auto)")
    group.add_argument("--offload-folder", metavar="DIR",
                       help="where offloaded weights are kept (implies --device-map auto)")
    group.add_argument("--quantization", choices=QUANTIZATIONS.names(),
                       help="load the weights quantized: int8/int4 (optimum-quanto), nf4 "
                            "(bitsandbytes, CUDA)")


def load_options_of(args: argparse.Namespace, part: str | None = None) -> dict[str, Any]:
    """The :func:`attnprobe.load_model` keywords of the parsed loading options (those given).

    ``part`` names one of several models a command loads (``diff``: ``"a"``, ``"b"``): each
    then offloads into its own subfolder of ``--offload-folder``, since a re-saved offloaded
    weight of one model must not replace the other's under the same name.
    """
    options = {name: getattr(args, name) for name in LOAD_OPTIONS
               if getattr(args, name, None) is not None}
    if part is not None and "offload_folder" in options:
        options["offload_folder"] = str(Path(options["offload_folder"]) / part)
    return options
