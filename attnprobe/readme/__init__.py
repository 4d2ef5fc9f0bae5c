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

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attnprobe.core.plugins import import_modules
from attnprobe.core.registry import Registry

__all__ = ["PARTS", "ReadmePart", "markers", "parts", "render_readme", "stale_parts"]


@dataclass(frozen=True)
class ReadmePart:
    """One generated span of the README: its marker name and the function that writes it
    (without the markers)."""

    name: str
    markdown: Callable[[], str] = field(repr=False)


PARTS: Registry[ReadmePart] = Registry("README part")


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
