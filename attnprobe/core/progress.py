"""Progress bars (tqdm, from the ``hf`` extra) that every long-running analysis shares."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
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


class StepBar:
    """A bar over the steps of a run whose units each take several slow steps (a text's
    attribution methods, then its attention views): it advances when a step ends and names
    the running step after the count (``compare: 3/8 [text 1: integrated_gradients]``), so
    a long step never leaves the bar still and silent. Does nothing when not ``enabled``
    (and draws on rank 0 only).

    Use as a context manager; :meth:`begin` marks the next step as running (and the previous
    one as done), leaving the context ends the last one.
    """

    def __init__(self, *, enabled: bool, desc: str, total: int, unit: str = "step",
                 rank: int = 0) -> None:
        self._bar: Any = require("tqdm").tqdm(total=total, desc=desc, unit=unit,
                                              disable=rank != 0) if enabled else None
        self._running = False

    def begin(self, label: str) -> None:
        """Step ``label`` starts; the step before it (if any) is done."""
        if self._bar is None:
            return
        if self._running:
            self._bar.update(1)
        self._running = True
        self._bar.set_postfix_str(label)

    def close(self) -> None:
        if self._bar is None:
            return
        if self._running:
            self._bar.update(1)
            self._running = False
        self._bar.set_postfix_str("")
        self._bar.close()

    def __enter__(self) -> StepBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.close()
        elif self._bar is not None:  # an error: leave the count where the failed step began
            self._bar.close()
