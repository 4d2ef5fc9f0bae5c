"""The README's generated parts, written from the registries (``make readme``).

Each part is one module of this package defining ``PART = ReadmePart(name, markdown)``:
``markdown()`` returns the text between the README markers ``<!-- generated:NAME:start -->``
and ``<!-- generated:NAME:end -->``. The modules are discovered
(:func:`~attnprobe.core.plugins.import_modules`), so a new generated table is one module here
and one pair of markers in the README. A test fails while the README and the registries
disagree (:func:`stale_parts`).

Example:
    >>> text = render_readme(Path("README.md").read_text())  # every part rewritten
    >>> stale_parts(Path("README.md").read_text())  # [] when the README is current
    []
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attnprobe.core.plugins import import_modules
from attnprobe.core.registry import Registry

__all__ = ["PARTS", "ReadmePart", "bullet", "entry_help", "markers", "paragraph", "parts",
           "render_readme", "stale_parts"]


@dataclass(frozen=True)
class ReadmePart:
    """One generated span of the README: its marker name and the function that writes it
    (without the markers)."""

    name: str
    markdown: Callable[[], str] = field(repr=False)


PARTS: Registry[ReadmePart] = Registry("README part")


def entry_help(entry: object) -> str:
    """What a registry entry says about itself, one phrase: its ``summary`` when it has one,
    else the first paragraph of its docstring (joined into one line, final full stop
    dropped); empty when it has neither."""
    summary = getattr(entry, "summary", "")
    if isinstance(summary, str) and summary.strip():
        return " ".join(summary.split())
    doc = inspect.getdoc(entry) or ""
    return " ".join(doc.split("\n\n")[0].split()).rstrip(".")


# A word that would start a new markdown block at the start of a line: a quote, a heading, a
# list item, a table row.
BLOCK_START = re.compile(r"^(?:[>#|]|[-+*=]$|\d+[.)]$)")
GLUE = "\x00"  # a space that may not break


def paragraph(text: str, width: int = 96, *, first: str = "", rest: str = "") -> str:
    """``text`` wrapped at ``width`` (never broken at a hyphen or inside a word), its first
    line led by ``first`` and the others by ``rest``. A word that would make markdown read a
    line as a new block (``>``, ``-``, ``1.``, ...) is kept on the line before it."""
    words = text.split()
    glued = words[:1]
    for word in words[1:]:
        if BLOCK_START.match(word):
            glued[-1] += GLUE + word
        else:
            glued.append(word)
    return textwrap.fill(" ".join(glued), width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False).replace(GLUE, " ")


def bullet(text: str, width: int = 96) -> str:
    """``text`` as one markdown list item wrapped at ``width`` (continuation lines indented)."""
    return paragraph(text, width, first="- ", rest="  ")


def markers(name: str) -> tuple[str, str]:
    """The start and end markers of part ``name``."""
    return f"<!-- generated:{name}:start -->", f"<!-- generated:{name}:end -->"


def parts() -> list[ReadmePart]:
    """Every README part, discovered from this package's modules (each registers its
    ``PART`` on import)."""
    for module in import_modules(__name__):
        part = getattr(module, "PART", None)
        if isinstance(part, ReadmePart) and part.name not in PARTS:
            PARTS.register(part.name)(part)
    return PARTS.values()


def _replace(text: str, part: ReadmePart) -> str:
    start, end = markers(part.name)
    begin, stop = text.find(start), text.find(end)
    if begin < 0 or stop < begin:
        raise ValueError(f"README has no {start} ... {end} span for part {part.name!r}")
    body = part.markdown().strip("\n")
    return f"{text[:begin]}{start}\n{body}\n{text[stop:]}"


def render_readme(text: str) -> str:
    """``text`` (the README) with every generated part rewritten from the registries."""
    for part in parts():
        text = _replace(text, part)
    return text


def stale_parts(text: str) -> list[str]:
    """The names of the parts whose README span differs from what the registries give."""
    return [part.name for part in parts() if _replace(text, part) != text]


def main(readme: Path | None = None) -> list[str]:
    """Rewrite the README's generated parts in place; returns the names that changed."""
    path = readme or Path(__file__).resolve().parents[2] / "README.md"
    text = path.read_text(encoding="utf-8")
    changed = stale_parts(text)
    path.write_text(render_readme(text), encoding="utf-8")
    return changed
