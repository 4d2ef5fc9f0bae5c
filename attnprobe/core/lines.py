"""Line-based input files, read one way everywhere: a line ends at ``\\n`` (or ``\\r\\n``), and
nowhere else.

``str.splitlines`` also breaks at U+2028 / U+2029, form feed, vertical tab, NEL (U+0085) and
U+001C-U+001E; text files of real corpora hold those inside a sentence (copied from PDFs and
web pages), and a split there turns one text into two, shifts every later ``example_id`` and
pairs clean and corrupted files wrongly. :func:`split_lines` is the split every line-based
input uses (``--text-file``, ``--ids-file``, ``--clean-file`` / ``--corrupt-file``, CoNLL-U,
the corpora of the analyses); :func:`read_lines` reads a UTF-8 file (a leading BOM dropped)
into its numbered, non-blank lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from attnprobe.errors import InputError

__all__ = ["Line", "read_lines", "split_lines"]


class Line(NamedTuple):
    """One non-blank line of a file: its 1-based ``number`` in the file and its ``text``
    (surrounding whitespace stripped)."""

    number: int
    text: str


def split_lines(text: str) -> list[str]:
    """``text`` split at ``\\n`` only; a ``\\r`` before the ``\\n`` is dropped (Windows line
    ends), and a final line end gives no empty last line (as ``str.splitlines``).

    Example:
        >>> split_lines("a\\u2028b\\r\\nc\\x0cd\\n")
        ['a\\u2028b', 'c\\x0cd']
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: str | Path, what: str = "text") -> list[Line]:
    """The non-blank lines of the UTF-8 file ``path``, stripped, with their line numbers
    (blank lines are left out; a BOM at the start is dropped).

    Raises:
        InputError: the file is missing or not UTF-8, or every line is blank (``what`` names
            the file's content in the message, e.g. ``"ids"``).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from None
    found = [Line(n, line.strip()) for n, line in enumerate(split_lines(text), start=1)
             if line.strip()]
    if not found:
        raise InputError(f"{what} file {path} has no {what} (every line is blank)")
    return found
