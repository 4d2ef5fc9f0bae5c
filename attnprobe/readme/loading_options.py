"""The README's table of loading options, written from :func:`attnprobe.load_options.dtype_names`,
:data:`~attnprobe.load_options.DEVICE_MAPS` and :data:`~attnprobe.load_options.QUANTIZATIONS`
(each quantization with its summary)."""

from __future__ import annotations

from attnprobe.readme import ReadmePart


def _names(values: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in values)


def markdown() -> str:
    """One row per loading option: the values it takes and what serves it."""
    from attnprobe.load_options import DEVICE_MAPS, QUANTIZATIONS, dtype_names

    quantizations = "; ".join(f"`{q.name}`: {q.summary}" for q in QUANTIZATIONS.values())
    rows = [
        ("dtype", f"{_names(dtype_names())} (default fp32: a bf16 checkpoint is upcast "
                  "unless asked for bf16; a quantized load keeps the checkpoint's)",
         "`from_pretrained(dtype=...)`; fp16 on a CPU warns (few CPUs have fp16 matmul "
         "kernels)"),
        ("device", "`cpu`, `cuda`, `cuda:1`, `mps`", "the whole model on that device"),
        ("device_map", f"{_names(list(DEVICE_MAPS))}, a JSON file or dict `{{module: device}}` "
                       "(`\"disk\"` offloads)", "accelerate (`pip install 'attnprobe[big]'`)"),
        ("max_memory", "`0=20GiB,cpu=60GiB`", "accelerate; implies `device_map=\"auto\"`"),
        ("offload_folder", "a writable folder",
         "accelerate's disk offload; implies `device_map=\"auto\"`"),
        ("quantization", quantizations,
         "transformers' quantizers (`attnprobe[quanto]`, `attnprobe[bnb]`)"),
    ]
    lines = ["| option | values | through |", "|---|---|---|"]
    lines += [f"| `{name}` / `--{name.replace('_', '-')}` | {values} | {through} |"
              for name, values, through in rows]
    return "\n".join(lines)


PART = ReadmePart("loading-options", markdown)
