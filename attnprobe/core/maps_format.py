"""The on-disk format of saved attention maps: where the files go, what a ``.json`` sidecar
holds, and the checks run on it before anything is loaded (``attnprobe.types.save_maps`` /
``load_maps`` build and read the maps themselves).

A save is ``<name>.npz`` (``pattern_<i>`` and optional ``scores_<i>`` float32 arrays,
``[layer, head, query, key]``) plus ``<name>.json``: ``{"npz_sha256": ..., "maps": [entry,
...]}``, one entry per map with the fields of :data:`MAP_FIELDS` (token ids ``query_ids`` /
``key_ids`` when known; files written before them load without).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnprobe.core.untrusted import check_fields, read_json
from attnprobe.errors import FileFormatError

__all__ = ["FORMAT_VERSION", "MAP_FIELDS", "MAP_REQUIRED", "SIDECAR_FIELDS", "expected_arrays",
           "is_maps_sidecar", "maps_paths", "read_sidecar"]

FORMAT_VERSION = 1


def maps_paths(path: str | Path) -> tuple[Path, Path]:
    """``(npz, json)``: where ``save_maps`` writes maps given ``path`` (``.npz`` added unless
    present) and the ``.json`` sidecar next to it.

    Example:
        >>> [str(p) for p in maps_paths("runs/maps")]
        ['runs/maps.npz', 'runs/maps.json']
    """
    path = Path(path)
    npz = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
    return npz, npz.with_suffix(".json")


def is_maps_sidecar(path: str | Path) -> bool:
    """Whether ``path`` is a ``.json`` sidecar written by ``save_maps`` (saving maps may
    replace it; any other file there is the user's and is never overwritten).

    Example:
        >>> ap.save_maps(maps, "saved")
        PosixPath('saved.npz')
        >>> is_maps_sidecar("saved.json")
        True
        >>> _ = Path("mine.json").write_text('{"maps": 3}')
        >>> is_maps_sidecar("mine.json")
        False
    """
    try:
        spec = json.loads(Path(path).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    entries = spec.get("maps") if isinstance(spec, dict) else None
    return isinstance(entries, list) and all(
        isinstance(m, dict) and "format_version" in m for m in entries)


# What a sidecar holds, as type hints; checked on load before anything is built.
SIDECAR_FIELDS = {"npz_sha256": str, "maps": list[Any]}  # older files have no npz_sha256
MAP_FIELDS = {"format_version": int, "query_tokens": list[str], "key_tokens": list[str],
              "layers": list[int], "heads": list[int], "kind": str, "stack": str,
              "example_id": str, "check_rows": bool, "info": Any, "prompt_length": int,
              "query_ids": list[int], "key_ids": list[int], "learned_sink": bool}
# older files lack them
OPTIONAL_FIELDS = ("prompt_length", "query_ids", "key_ids", "learned_sink")
MAP_REQUIRED = [name for name in MAP_FIELDS if name not in OPTIONAL_FIELDS]


def read_sidecar(meta: Path, max_bytes: int, *, info_fields: dict[str, Any],
                 info_required: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    """``(map entries, npz digest)`` of a sidecar, checked to be what ``save_maps`` writes
    (each entry's ``info`` against ``info_fields``, type hints by name)."""
    spec = check_fields(read_json(meta, max_bytes=max_bytes), SIDECAR_FIELDS, str(meta),
                        required=["maps"])
    if not spec["maps"]:
        raise FileFormatError(f"{meta}: 'maps' is empty")
    for i, entry in enumerate(spec["maps"]):
        where = f"{meta}: map {i}"
        version = entry.get("format_version", FORMAT_VERSION) if isinstance(entry, dict) \
            else FORMAT_VERSION
        if version != FORMAT_VERSION:  # first: a newer file may differ in every other field
            raise FileFormatError(f"{where}: unsupported format_version {version!r} (this "
                                  f"attnprobe reads {FORMAT_VERSION})")
        check_fields(entry, MAP_FIELDS, where, required=MAP_REQUIRED)
        check_fields(entry["info"], info_fields, f"{where}: info", required=info_required)
    return spec["maps"], spec.get("npz_sha256")


def expected_arrays(entries: list[dict[str, Any]]) -> dict[str, tuple[int, ...]]:
    """The shape every array of the ``.npz`` must have, by name, from checked sidecar
    entries."""
    expected: dict[str, tuple[int, ...]] = {}
    for i, entry in enumerate(entries):
        shape = (len(entry["layers"]), len(entry["heads"]), len(entry["query_tokens"]),
                 len(entry["key_tokens"]))
        expected[f"pattern_{i}"] = expected[f"scores_{i}"] = shape
    return expected
