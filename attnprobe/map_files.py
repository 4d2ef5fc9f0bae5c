"""Saving and loading attention maps: one ``.npz`` of float32 arrays plus a ``.json`` sidecar
(the format: :mod:`attnprobe.core.maps_format`), written atomically, never pickled, and checked
before anything is loaded.

:func:`save_maps` writes any maps that have the :class:`~attnprobe.types.AttentionMap` fields;
:func:`read_maps` checks a save and hands each map's sidecar entry and arrays to a builder
(:func:`attnprobe.types.load_maps` builds the ``AttentionMap`` objects). ``attnprobe.types``
re-exports both public names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import numpy as np

from attnprobe.core.files import atomic_path
from attnprobe.core.maps_format import (
    FORMAT_VERSION,
    expected_arrays,
    is_maps_sidecar,
    maps_paths,
    read_sidecar,
)
from attnprobe.core.untrusted import DEFAULT_MAX_BYTES, read_npz, sha256_of
from attnprobe.errors import FileFormatError, InputError, OutputError

__all__ = ["map_entry", "read_maps", "save_maps"]

T = TypeVar("T")
# (sidecar entry, pattern [layer, head, query, key], scores or None) -> one map
Build = Callable[[dict[str, Any], np.ndarray, "np.ndarray | None"], T]


def map_entry(amap: Any) -> dict[str, Any]:
    """The sidecar entry of one map: every field but its tensors (JSON types only)."""
    return {
        "format_version": FORMAT_VERSION,
        "query_tokens": list(amap.query_tokens),
        "key_tokens": list(amap.key_tokens),
        "layers": list(amap.layers),
        "heads": list(amap.heads),
        "kind": amap.kind,
        "stack": amap.stack,
        "example_id": amap.example_id,
        "check_rows": amap.check_rows,
        "info": amap.info.to_dict(),
        **({} if amap.prompt_length is None else {"prompt_length": amap.prompt_length}),
        **({} if amap.query_ids is None else {"query_ids": list(amap.query_ids)}),
        **({} if amap.key_ids is None else {"key_ids": list(amap.key_ids)}),
        **({"learned_sink": True} if amap.learned_sink else {}),
    }


def save_maps(maps: Sequence[Any], path: str | Path) -> Path:
    """Save several maps to one ``.npz`` (float32 arrays) plus a ``.json`` sidecar.

    Both files are written atomically (temporary file + rename), and the sidecar records the
    ``.npz``'s SHA-256, so a save killed between the two renames leaves a pair that
    :func:`~attnprobe.types.load_maps` refuses rather than one that mixes two saves.

    Raises:
        InputError: no maps.
        OutputError: the ``.npz`` or ``.json`` path is a directory or cannot be written, or
            the ``.json`` exists and is not the sidecar of saved maps.

    Example:
        >>> save_maps(maps, "two_maps")                 # two texts: patterns [6, 12, q, k]
        PosixPath('two_maps.npz')
        >>> sorted(p.name for p in Path(".").glob("two_maps.*"))
        ['two_maps.json', 'two_maps.npz']
    """
    if not maps:
        raise InputError("no attention maps to save")
    npz, meta = maps_paths(path)
    if meta.is_file() and not is_maps_sidecar(meta):
        raise OutputError(f"saving maps to {npz} would overwrite {meta}, which is not the "
                          "sidecar of saved maps; choose another name")
    arrays: dict[str, np.ndarray] = {}
    for i, amap in enumerate(maps):
        arrays[f"pattern_{i}"] = amap.pattern.numpy()
        if amap.scores is not None:
            arrays[f"scores_{i}"] = amap.scores.numpy()
    with atomic_path(npz) as npz_part, atomic_path(meta) as meta_part:
        with open(npz_part, "wb") as stream:
            np.savez_compressed(stream, **arrays)
        spec = {"npz_sha256": sha256_of(npz_part), "maps": [map_entry(m) for m in maps]}
        meta_part.write_text(json.dumps(spec, indent=1))
    return npz


def read_maps(path: str | Path, build: Build[T], info_type: type, *,
              max_bytes: int = DEFAULT_MAX_BYTES) -> list[T]:
    """The maps saved at ``path``, each made by ``build(entry, pattern, scores)``.

    The sidecar is read and checked first (its ``info`` against the fields of the dataclass
    ``info_type``); its recorded SHA-256 must match the ``.npz``; then the ``.npz``'s zip
    directory and ``.npy`` headers must declare exactly the arrays and shapes the sidecar
    describes, within ``max_bytes`` in total, before any array is inflated
    (:mod:`attnprobe.core.untrusted`). An InputError of ``build`` (a map that does not
    validate) becomes a FileFormatError naming the map.

    Raises:
        InputError: the ``.npz`` or its ``.json`` sidecar is missing.
        FileFormatError: anything malformed, inconsistent or over ``max_bytes`` (one line).
    """
    npz, meta = maps_paths(path)
    if not npz.is_file() or not meta.is_file():
        raise InputError(f"no saved maps at {npz}: expected {npz} and its sidecar {meta}")
    info_required = [f.name for f in fields(info_type) if f.default is MISSING
                     and f.default_factory is MISSING]
    entries, digest = read_sidecar(meta, max_bytes, info_fields=get_type_hints(info_type),
                                   info_required=info_required)
    expected = expected_arrays(entries)
    if digest is not None and sha256_of(npz) != digest:
        raise FileFormatError(f"{npz} is not the file its sidecar {meta.name} was written with "
                              "(an interrupted save, or files from two saves); save again")
    arrays = read_npz(npz, expected, required=[f"pattern_{i}" for i in range(len(entries))],
                      max_bytes=max_bytes)
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(build(entry, arrays[f"pattern_{i}"], arrays.get(f"scores_{i}")))
        except InputError as exc:
            raise FileFormatError(f"{meta}: map {i}: {exc}") from None
    return out
