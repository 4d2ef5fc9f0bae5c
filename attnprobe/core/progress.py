"""Progress bars (tqdm, from the ``hf`` extra) that every long-running analysis shares."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from attnprobe.core.optional import require

T = TypeVar("T")


def progress_bar(items: Iterable[T], *, enabled: bool, desc: str, unit: str,
                 total: int | None = None, rank: int = 0) -> Iterable[T]:
    """``items`` wrapped in a tqdm bar on stderr when ``enabled`` (only rank 0 draws it)."""
    if not enabled:
        return items
    tqdm: Any = require("tqdm").tqdm
    return tqdm(items, desc=desc, unit=unit, total=total, disable=rank != 0)
