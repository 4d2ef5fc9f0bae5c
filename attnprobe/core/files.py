"""Writing results safely: atomic writes, and output paths checked before any work starts.

- :func:`atomic_write` writes to a temporary file in the destination's folder and renames it
  over the destination only when the writer finished, so a killed run leaves the old file (or
  none), never a truncated one that looks valid.
- :func:`check_outputs` refuses, before a run starts, outputs that collide (two options naming
  the same file, a ``.npz`` whose ``.json`` sidecar is another output or would overwrite an
  unrelated file), that are directories, or whose folder cannot be written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from attnprobe.errors import OutputError

__all__ = ["atomic_path", "atomic_write", "check_outputs"]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path``; renamed onto ``path`` when the block succeeds,
    removed when it fails (also on Ctrl-C)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a directory; give a file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part" + path.suffix,
                                    dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(temporary_path)``, then rename it onto ``path``; returns ``path``."""
    with atomic_path(path) as temporary:
        write(temporary)
    return Path(path)


def _writable_folder(path: Path) -> None:
    """Create ``path``'s folder and write a probe file there: the surest check that the run's
    result can be written, done before the run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def check_outputs(outputs: Iterable[tuple[str, str | Path | None]], *,
                  sidecars: Iterable[str | Path] = ()) -> list[Path]:
    """Check ``(option, path)`` outputs before a run (``None`` paths are skipped).

    ``sidecars`` are files the run writes next to an output (e.g. the ``.json`` of a
    ``.npz``): they must not be another output, and must not already exist unless they are
    the sidecar of the same output written before (same stem, their pair exists too).
    Returns the resolved output paths.
    """
    seen: dict[Path, str] = {}
    paths = []
    for option, value in outputs:
        if value is None:
            continue
        path = Path(value)
        resolved = path.resolve()
        if resolved in seen:
            raise OutputError(f"{option} and {seen[resolved]} both write {path}; give two "
                              "different files")
        if path.is_dir():
            raise OutputError(f"{option} {path} is a directory; give a file name")
        _writable_folder(path)
        seen[resolved] = option
        paths.append(path)
    for sidecar in sidecars:
        side = Path(sidecar)
        resolved = side.resolve()
        if resolved in seen:
            raise OutputError(f"{seen[resolved]} {side} is also the .json sidecar of the maps; "
                              "give another name")
        if side.is_dir():
            raise OutputError(f"the sidecar {side} is a directory; give another name")
        if side.exists() and not side.with_suffix(".npz").exists():
            raise OutputError(f"writing the maps would overwrite {side}, which is not the "
                              "sidecar of saved maps; give another --out name")
    return paths
