"""One-line descriptions of result objects: what their ``__repr__`` shows, formatted alike.

Every result object (maps, tallies, censuses, comparisons, reports ...) prints as one line of
at most :data:`MAX_WIDTH` characters naming its shape, model and counts, e.g.
``AttentionMap(minilm, encoder self, 6 layers × 12 heads, 9 query × 9 key tokens, float32)``.
The helpers here never format more of a value than they show (a long token list or a
megabyte of HTML is cut before it is turned into text), so a repr stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["MAX_WIDTH", "counted", "describe", "grid", "indices", "quoted", "replace_marked",
           "size"]

MAX_WIDTH = 200
"""The longest repr a result object prints (longer ones are cut with an ellipsis)."""

ELLIPSIS = "…"


def counted(n: float, word: str | None = None, plural: str | None = None) -> str:
    """``4311`` -> ``"4,311"``; with ``word``: ``"4,311 tokens"``, ``"1 token"``.

    ``plural`` is the plural of ``word`` when adding an ``s`` is wrong.
    """
    number = f"{int(n):,}" if float(n).is_integer() else f"{n:,.3g}"
    if word is None:
        return number
    return f"{number} {word if n == 1 else plural or word + 's'}"


def size(n_bytes: int) -> str:
    """Bytes in decimal units: ``"812 B"``, ``"14.2 kB"``, ``"1.2 MB"``, ``"3.1 GB"``."""
    value = float(n_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


def indices(values: Iterable[int], limit: int = 6) -> str:
    """Sorted indices as runs: ``"0-5"``, ``"2,5"``, ``"0-3,7,9"``; after ``limit`` runs
    ``"…"`` (so a long list never turns into a long string)."""
    runs: list[list[int]] = []
    for value in sorted(set(int(v) for v in values)):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    text = [str(a) if a == b else f"{a}{',' if b == a + 1 else '-'}{b}" for a, b in runs]
    return ",".join(text[:limit]) + (f",{ELLIPSIS}" if len(text) > limit else "")


def grid(layers: Sequence[int] | int, heads: Sequence[int] | int,
         n_layers: int | None = None, n_heads: int | None = None) -> str:
    """``"6 layers × 12 heads"``; a subset of the model's ``n_layers`` / ``n_heads`` names its
    indices: ``"2 layers (2,5) × 2 heads (0,8)"``. Counts may be given as ints."""
    parts = []
    for values, total, word in ((layers, n_layers, "layer"), (heads, n_heads, "head")):
        if isinstance(values, int):
            parts.append(counted(values, word))
            continue
        text = counted(len(values), word)
        if total is not None and list(values) != list(range(total)) and values:
            text += f" ({indices(values)})"
        parts.append(text)
    return " × ".join(parts)


def quoted(text: str, width: int = 40) -> str:
    """``repr`` of ``text`` cut to about ``width`` characters (cut before it is formatted)."""
    if len(text) <= width:
        return repr(text)
    return repr(text[:width - 1]) + ELLIPSIS


def describe(name: str, *parts: str | None, sep: str = ", ") -> str:
    """``name(part, part, ...)`` of the non-empty parts, on one line and at most
    :data:`MAX_WIDTH` characters."""
    body = sep.join(p for p in parts if p)
    text = f"{name}({body})".replace("\n", " ")
    if len(text) > MAX_WIDTH:
        text = text[:MAX_WIDTH - 2] + ELLIPSIS + ")"
    return text


def replace_marked(text: str, section: str, begin: str, end: str) -> str:
    """``text`` with the span from marker ``begin`` to marker ``end`` (both included) replaced
    by ``section`` (a generated README table that carries its own markers).

    Example:
        >>> replace_marked("a <!--b--> old <!--e--> z", "<!--b--> new <!--e-->", "<!--b-->",
        ...                "<!--e-->")
        'a <!--b--> new <!--e--> z'
    """
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no {begin} ... {end} span to rewrite")
    return text[:start] + section + text[stop + len(end):]
