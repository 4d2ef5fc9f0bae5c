"""What the label rules' evidence is made of: a head's scores read as numbers
(:func:`score_of`), ``"name=value op threshold"`` strings (:func:`comparison`,
:func:`all_hold`), and the check that a score table can be judged at all
(:func:`check_judgeable`). The rules are in :mod:`attnprobe.heads.labels`."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence

from attnprobe.errors import InputError

__all__ = ["OPERATORS", "Row", "all_hold", "check_judgeable", "comparison", "number_text",
           "score_of"]

Row = Mapping[str, object]  # one head's scores by name

# ---- what the rules can judge -------------------------------------------------------------

# The mean over the rows that may see two keys or more (heads/stats/rows.py): NaN when no row
# of the corpus does.
SEVERAL_KEYS = "entropy_norm"


def check_judgeable(rows: Sequence[Row]) -> None:
    """Refuse a table in which no head saw a row with more than one key (a corpus of one-token
    texts: 1 x 1 maps). Every head then puts its whole weight on the lone key, which every rule
    would read as a sink or a one-hot pattern: there is nothing to tell the heads apart by.
    Tables without the ``entropy_norm`` column are not checked."""
    if not rows or any(SEVERAL_KEYS not in row for row in rows):
        return
    if all(score_of(row, SEVERAL_KEYS) is None for row in rows):
        raise InputError("no attention row of the corpus sees more than one key (every text "
                         "is one token: 1 x 1 maps), so the heads cannot be told apart "
                         f"({SEVERAL_KEYS} is NaN for every head); give texts of two tokens "
                         "or more")


# ---- evidence helpers ---------------------------------------------------------------------

def score_of(row: Row, name: str) -> float | None:
    """The score as a float, or None when it is missing or not finite."""
    value = row.get(name)
    if value is None:
        return None
    try:
        value = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def number_text(value: float, other: float | None = None) -> str:
    """Short form of a number: 3 significant digits, more when needed to differ from ``other``."""
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    for digits in range(3, 8):
        text = f"{value:.{digits}g}"
        if other is None or text != f"{other:g}":
            return text
    return text


def comparison(name: str, value: float, op: str, threshold: float) -> str:
    """``"prev=0.83 > 0.5"``."""
    return f"{name}={number_text(value, threshold)} {op} {threshold:g}"


OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def all_hold(row: Row, *tests: tuple[str, str, float]) -> str | None:
    """Evidence when every ``(column, op, threshold)`` holds, else None."""
    parts = []
    for name, op, threshold in tests:
        value = score_of(row, name)
        if value is None or not OPERATORS[op](value, threshold):
            return None
        parts.append(comparison(name, value, op, threshold))
    return ", ".join(parts)
