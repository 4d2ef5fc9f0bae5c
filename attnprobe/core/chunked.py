"""Many units of work per forward: the chunk-and-shard loop of the batched experiments.

A **unit** is one thing done to every example of a batch (a patch, a perturbed head ...). A
forward runs a batch of ``b`` examples repeated once per unit of a **chunk** of ``c`` units
(``b · c <= batch_size`` rows, :func:`forward_rows`): row ``k·b + t`` is example ``t`` with
unit ``k``. :func:`run_chunked` cuts each batch's units into chunks (:func:`even_split`, or
the caller's ``split``), splits the chunks over the ranks of a ``torch.distributed`` group
(:func:`~attnprobe.core.distributed.run_sharded`), runs ``fn`` on each and gathers what they
return, in chunk order on every rank.

Example:
    >>> spans = [slice(0, 2), slice(2, 3)]  # two batches of examples
    >>> run_chunked(lambda chunk: [(chunk.span.start, u) for u in chunk.units], spans,
    ...             lambda span: ["a", "b", "c"], batch_size=4)
    [(0, 'a'), (0, 'b'), (0, 'c'), (2, 'a'), (2, 'b'), (2, 'c')]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from attnprobe.core.distributed import run_sharded

__all__ = ["Chunk", "Split", "even_split", "forward_rows", "plan_chunks", "run_chunked"]

U = TypeVar("U")
R = TypeVar("R")

Split = Callable[[Sequence[U], int], list[tuple[int, int]]]
"""``split(units, per_forward)``: ``(start, stop)`` of each forward's units, in order, each
at most ``per_forward`` long, together covering ``units``."""


def forward_rows(batch_size: int, n_examples: int, n_units: int) -> tuple[int, int]:
    """``(examples, units)`` per forward: ``b`` examples repeated for ``c`` units, ``b·c``
    rows, at most ``batch_size`` (at least one unit)."""
    examples = min(batch_size, n_examples)
    return examples, max(1, min(n_units, batch_size // examples))


def even_split(units: Sequence[object], per_forward: int) -> list[tuple[int, int]]:
    """``per_forward`` units per chunk, the last one holding the rest."""
    return [(start, min(start + per_forward, len(units)))
            for start in range(0, len(units), per_forward)]


@dataclass(frozen=True)
class Chunk(Generic[U]):
    """The work of one forward: ``units`` applied to each example of ``span``.

    ``start`` is the place of ``units[0]`` among the batch's units, ``total`` how many units
    the batch has (a batch's units may depend on it: e.g. one per position of its longest
    example).
    """

    span: slice
    start: int
    units: tuple[U, ...]
    total: int

    def rows(self) -> Iterator[tuple[int, U, int, int]]:
        """``(k, unit, t, example)`` for each row ``k·b + t`` of the forward, in row order:
        ``example`` is the index of the batch's ``t``-th example (``span.start + t``)."""
        for k, unit in enumerate(self.units):
            for t in range(self.span.stop - self.span.start):
                yield k, unit, t, self.span.start + t


def plan_chunks(spans: Iterable[slice], units_of: Callable[[slice], Sequence[U]], *,
                batch_size: int, split: Split = even_split) -> list[Chunk[U]]:
    """The chunks of every batch of examples (``spans``), in order: ``units_of(span)`` cut by
    ``split`` into forwards of at most ``batch_size`` rows (:func:`forward_rows`)."""
    found: list[Chunk[U]] = []
    for span in spans:
        units = tuple(units_of(span))
        _, per_forward = forward_rows(batch_size, span.stop - span.start, len(units))
        found += [Chunk(span, start, units[start:stop], len(units))
                  for start, stop in split(units, per_forward)]
    return found


def run_chunked(fn: Callable[[Chunk[U]], Iterable[R]], spans: Iterable[slice],
                units_of: Callable[[slice], Sequence[U]], *, batch_size: int,
                split: Split = even_split, distributed: bool | None = None,
                progress: bool = False, desc: str = "") -> list[R]:
    """Everything ``fn`` returns for each chunk of every batch (:func:`plan_chunks`), the
    chunks split over the ranks when ``distributed`` (a progress bar reading ``desc`` when
    ``progress``); every rank gets the whole list, in chunk order.

    ``fn`` runs a chunk's forward(s): it gets a :class:`Chunk` and returns its results (e.g.
    one table row per unit × example, :meth:`Chunk.rows`). What depends on the batch alone
    (its unpatched runs) is the caller's to keep: a rank runs its chunks in order, so keeping
    the last batch's is enough.
    """
    chunks = plan_chunks(spans, units_of, batch_size=batch_size, split=split)
    parts = run_sharded(lambda chunk: list(fn(chunk)), chunks, distributed=distributed,
                        progress=progress, desc=desc, unit="batch")
    return [item for part in parts for item in part]
