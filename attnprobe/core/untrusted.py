"""Reading files that may be hostile: ``.npz`` archives and the JSON that describes them.

- :func:`read_npz`: ``np.load`` trusts the file: an ``.npy`` header may declare hundreds of
  GiB, a zip member may inflate a megabyte into gigabytes, and a malformed member surfaces as
  a raw zipfile, zlib or numpy traceback. :func:`read_npz` first reads the zip's directory
  and each member's ``.npy`` header (a few hundred bytes) and checks them against what the
  caller expects (names, shapes, kind of dtype) and against a byte limit; only then are the
  arrays read, each one no larger than its header declared.
- :func:`read_json` (size-limited) and :func:`check_fields`, which checks a JSON object's
  fields against type hints (``list[str]``, ``int``, ``bool | None``, ...), so a crafted file
  gives one line naming the field, never a ``TypeError`` deep inside.
- :func:`sha256_of` a file, to tie two files written together.

Every failure is a one-line :class:`FileFormatError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import types
import zipfile
import zlib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any, Union, get_args, get_origin

import numpy as np

from attnprobe.errors import FileFormatError

__all__ = ["DEFAULT_MAX_BYTES", "check_fields", "matches", "read_json", "read_npz", "sha256_of",
           "size_text"]

DEFAULT_MAX_BYTES = 2**30  # 1 GiB of arrays held at once by default; callers may raise it
_MAX_HEADER = 10_000  # numpy's own cap on an .npy header
_BROKEN = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError, NotImplementedError,
           RuntimeError)  # what zipfile / numpy raise on damaged or unsupported members


def size_text(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def _line(exc: BaseException) -> str:
    """A library's message on one line (numpy's header errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _over(size: int, limit: int) -> str:
    """``"1.6 GiB, over the limit of 1.0 GiB"``; in bytes where rounding would
    make the two look equal."""
    shown = (size_text(size), size_text(limit))
    if shown[0] == shown[1]:
        shown = (f"{size} bytes", f"{limit} bytes")
    return f"{shown[0]}, over the limit of {shown[1]}"


def _header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, header length)`` of the ``.npy`` data at the start of ``stream``."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=_MAX_HEADER)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=_MAX_HEADER)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    return tuple(shape), dtype, stream.tell()


def _members(archive: zipfile.ZipFile, where: str, expected: Collection[str],
             required: Collection[str]) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by array name, each an expected ``.npy``, required ones present."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if not info.filename.endswith(".npy") or name not in expected:
            raise FileFormatError(f"{where}: unexpected member {info.filename!r} (not an array "
                                  "its description names)")
        if name in members:
            raise FileFormatError(f"{where}: array {name!r} is stored twice")
        if info.flag_bits & 0x1:
            raise FileFormatError(f"{where}: array {name!r} is encrypted")
        members[name] = info
    missing = [name for name in required if name not in members]
    if missing:
        raise FileFormatError(f"{where}: missing array {missing[0]!r}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return members


def read_npz(path: str | Path, expected: Mapping[str, tuple[int, ...]], *,
             required: Collection[str] = (), kind: str = "f",
             max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path``; never unpickles, never inflates blindly.

    Args:
        expected: array name -> the shape it must have. A member not named here is an error.
        required: names that must be present (the others in ``expected`` are optional).
        kind: allowed numpy dtype kinds (``"f"``: floating point). Object arrays never load.
        max_bytes: limit on the arrays' total size, as declared by the zip directory and by
            the ``.npy`` headers, checked before any array is read.

    Raises:
        FileFormatError: not a zip, an unexpected, missing, duplicated or encrypted member,
            a header that is not ``.npy`` or declares another shape or dtype kind, declared
            sizes over ``max_bytes`` or disagreeing with each other, or damaged data.
    """
    where = str(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise FileFormatError(f"{where}: not a readable .npz (zip) file: {_line(exc)}") \
            from None
    with archive:
        members = _members(archive, where, expected, required)
        declared = sum(info.file_size for info in members.values())
        if declared > max_bytes:
            raise FileFormatError(f"{where}: its arrays declare uncompressed "
                                  f"{_over(declared, max_bytes)} (max_bytes)")
        for name, info in members.items():
            try:
                with archive.open(info) as stream:
                    shape, dtype, header = _header(stream)
            except _BROKEN as exc:
                raise FileFormatError(f"{where}: array {name!r} has no valid .npy header: "
                                      f"{_line(exc)}") from None
            if dtype.hasobject or dtype.kind not in kind:
                wanted = "floating-point numbers" if kind == "f" else f"dtype kinds {kind!r}"
                raise FileFormatError(f"{where}: array {name!r} has dtype {dtype}; expected "
                                      f"{wanted} (object arrays are never loaded)")
            nbytes = math.prod(shape) * dtype.itemsize
            if shape != tuple(expected[name]):
                raise FileFormatError(f"{where}: array {name!r} has shape {shape} "
                                      f"({size_text(nbytes)}); its description says "
                                      f"{tuple(expected[name])}")
            if header + nbytes != info.file_size:
                raise FileFormatError(f"{where}: array {name!r} declares {size_text(nbytes)} of "
                                      f"data but its zip entry holds "
                                      f"{size_text(info.file_size - header)}")
        arrays = {}
        for name, info in members.items():
            try:
                with archive.open(info) as stream:
                    arrays[name] = np.lib.format.read_array(stream, allow_pickle=False,
                                                            max_header_size=_MAX_HEADER)
            except _BROKEN as exc:
                raise FileFormatError(f"{where}: array {name!r} is damaged: {_line(exc)}") \
                    from None
    return arrays


# ------------------------------------------------------------------------------------- JSON
def read_json(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The JSON value in ``path``, refused beyond ``max_bytes`` or when malformed."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise FileFormatError(f"{path}: {_over(size, max_bytes)} (max_bytes)")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, absurd nesting
        raise FileFormatError(f"{path}: not valid JSON ({_line(exc)})") from None


def matches(value: Any, hint: Any) -> bool:
    """Whether a JSON ``value`` fits the type ``hint``: ``str``, ``int`` (not a bool),
    ``float`` (an int is fine), ``bool``, ``None``, ``Any``, ``list[X]``, ``dict[K, V]``,
    unions."""
    if hint is Any:
        return True
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(matches(v, item) for v in value)
    if origin is dict:
        key, item = get_args(hint)
        return isinstance(value, dict) and all(
            matches(k, key) and matches(v, item) for k, v in value.items())
    if origin in (Union, types.UnionType):
        return any(matches(value, option) for option in get_args(hint))
    if hint is None or hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint)) if get_origin(hint) is None else str(hint)


def check_fields(entry: Any, fields: Mapping[str, Any], where: str, *,
                 required: Collection[str] | None = None) -> dict[str, Any]:
    """``entry`` as a dict whose fields fit their type hints in ``fields``.

    ``required``: fields that must be present (default: all of ``fields``). Fields not in
    ``fields`` are an error, so a misspelt key is not silently ignored.
    """
    if not isinstance(entry, dict):
        raise FileFormatError(f"{where}: expected an object; got {type(entry).__name__}")
    required = fields.keys() if required is None else required
    for key in required:
        if key not in entry:
            raise FileFormatError(f"{where}: missing {key!r}")
    for key, value in entry.items():
        if key not in fields:
            raise FileFormatError(f"{where}: unexpected field {key!r}")
        if not matches(value, fields[key]):
            raise FileFormatError(f"{where}: {key!r} must be {_describe(fields[key])}; got "
                                  f"{type(value).__name__}")
    return entry


def sha256_of(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in blocks (bounded memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
