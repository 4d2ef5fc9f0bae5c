"""Writing results safely: atomic writes, and output paths checked before any work starts.

- :func:`atomic_path` / :func:`atomic_write` write to a temporary file in the destination's
  folder and rename it over the destination only when the writer finished, so a killed run
  leaves the old file (or none), never a truncated one that looks valid. The new file gets the
  permissions a plain ``open(path, "w")`` would give it (a ``mkstemp`` file is private).
- :func:`check_outputs` refuses, before a run starts, outputs that collide (two options naming
  the same file, an output that is also an input, a sidecar such as the ``.json`` of a
  ``.npz`` that is another output or would overwrite an unrelated file), that are
  directories, or whose folder cannot be written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from attnprobe.errors import OutputError

__all__ = ["atomic_path", "atomic_write", "check_outputs"]

PathLike = str | Path
Option = tuple[str, PathLike | None]  # ("--out", "maps.npz"); None = option not given


def _umask() -> int:
    """The process umask. Read from /proc where possible: setting it to read it back (the
    portable way) briefly changes it for every thread."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """Permissions of the file written at ``path``: those of the file it replaces, else the
    default of a newly created file."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary path next to ``path``; renamed onto ``path`` when the block succeeds,
    removed when it fails (also on Ctrl-C). The temporary name keeps ``path``'s suffix, so
    writers that pick a format by suffix (or append one) see the right one."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part" + path.suffix,
                                        dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        os.chmod(temporary, _mode_for(path))
        # flush to disk before the rename: after a crash the name points at whole data
        with open(temporary, "rb") as written, suppress(OSError):  # some file systems refuse
            os.fsync(written.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write(path: PathLike, write: Callable[[Path], object]) -> Path:
    """``write(temporary_path)``, then rename it onto ``path``; returns ``path``."""
    with atomic_path(path) as temporary:
        write(temporary)
    return Path(path)


def _writable_folder(option: str, path: Path) -> None:
    """Create ``path``'s folder and write a probe file there: the surest check that the run's
    result can be written, done before the run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise OutputError(f"{option}: cannot write {path}: {exc.strerror or exc}") from None


def check_outputs(outputs: Iterable[Option], *,
                  sidecars: Iterable[tuple[PathLike, Callable[[Path], bool]]] = (),
                  inputs: Iterable[Option] = ()) -> list[Path]:
    """Check ``(option, path)`` outputs before a run (``None`` paths are skipped).

    Refused: two outputs naming one file (also when spelled differently or through a
    link), an output that is a directory, an output whose folder cannot be created or
    written, and an output that is one of the ``inputs`` (``(option, path)`` files the run
    reads). ``sidecars`` are ``(path, may_replace)`` files the run writes next to an output
    (e.g. the ``.json`` of a ``.npz``): a sidecar must not be another output or a
    directory, and may replace an existing file only when ``may_replace(path)`` says it is
    a sidecar written before. Returns the output paths.
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
        seen[resolved] = option
        paths.append(path)
    for option, value in inputs:
        if value is not None and Path(value).resolve() in seen:
            raise OutputError(f"{seen[Path(value).resolve()]} {value} is also the {option} "
                              "input; writing it would destroy the input, give another name")
    for sidecar, may_replace in sidecars:
        side = Path(sidecar)
        resolved = side.resolve()
        if resolved in seen:
            raise OutputError(f"{seen[resolved]} {side} is also the {side.suffix} sidecar "
                              "written next to another output; give another name")
        if side.is_dir():
            raise OutputError(f"the sidecar {side} of an output is a directory; give another "
                              "output name")
        if side.exists() and not may_replace(side):
            raise OutputError(f"the run would overwrite {side}, which is not a sidecar it wrote "
                              "before; give another output name")
    # last: the probe creates folders, which a refused run should not leave behind
    for option, path in zip(seen.values(), paths, strict=True):
        _writable_folder(option, path)
    return paths
