"""The chunk-and-shard loop (``attnprobe.core.chunked``): every unit meets every example of its
batch exactly once, no forward holds more than ``batch_size`` rows, the caller's split decides
where forwards end, and two ranks together return the single-process list on each rank."""

from __future__ import annotations

import itertools

import pytest

from attnprobe.core.chunked import Chunk, even_split, forward_rows, plan_chunks, run_chunked
from tests.integration.distributed import run_ranks

SPANS = [slice(0, 3), slice(3, 6), slice(6, 7)]  # 7 examples, batches of 3


def units_of(span: slice) -> list[tuple[int, int]]:
    """A batch's units depend on the batch (like one patch per position of its longest
    example): ``span.stop`` units, each named ``(batch start, i)``."""
    return [(span.start, i) for i in range(span.stop)]


def expected_cells() -> list[tuple[tuple[int, int], int]]:
    """``(unit, example)`` in batch, unit, example order, built without the module."""
    return [((span.start, i), example) for span in SPANS for i in range(span.stop)
            for example in range(span.start, span.stop)]


@pytest.mark.parametrize("batch_size", range(1, 12))
def test_every_unit_meets_every_example_of_its_batch_once(batch_size):
    chunks = plan_chunks(SPANS, units_of, batch_size=batch_size)
    cells = [(unit, example) for chunk in chunks for _, unit, _, example in chunk.rows()]
    assert cells == expected_cells()
    for chunk in chunks:
        examples = chunk.span.stop - chunk.span.start
        # at most batch_size rows, unless one unit alone is more (it still has to run)
        assert len(chunk.units) * examples <= batch_size or len(chunk.units) == 1
        assert chunk.total == len(units_of(chunk.span))
        assert chunk.units == tuple(units_of(chunk.span)[chunk.start:chunk.start
                                                          + len(chunk.units)])


def test_a_chunk_fills_its_forward_as_far_as_the_batch_size_allows():
    # 3 examples, batch_size 8: two units of 3 rows fit (6), a third would not (9)
    chunks = plan_chunks([slice(0, 3)], lambda span: list("abcde"), batch_size=8)
    assert [c.units for c in chunks] == [("a", "b"), ("c", "d"), ("e",)]
    assert [c.start for c in chunks] == [0, 2, 4]
    assert forward_rows(8, 3, 5) == (3, 2)


def test_rows_are_in_forward_row_order():
    chunk = Chunk(slice(4, 6), 2, ("x", "y", "z"), 5)
    rows = list(chunk.rows())
    b = 2
    # row k·b + t is example t of the batch with unit k
    assert [k * b + t for k, _, t, _ in rows] == list(range(len(chunk.units) * b))
    assert [(unit, example) for _, unit, _, example in rows] == list(
        itertools.product("xyz", (4, 5)))


def test_the_split_decides_where_forwards_end():
    def at_turns(units, per_forward):  # a forward ends where the letter changes, too
        cuts, start = [], 0
        for i in range(1, len(units) + 1):
            if i == len(units) or i - start == per_forward or units[i][0] != units[i - 1][0]:
                cuts.append((start, i))
                start = i
        return cuts

    units = ["a1", "a2", "a3", "b1", "b2", "c1"]
    chunks = plan_chunks([slice(0, 1)], lambda span: units, batch_size=2, split=at_turns)
    assert [c.units for c in chunks] == [("a1", "a2"), ("a3",), ("b1", "b2"), ("c1",)]
    assert even_split(units, 4) == [(0, 4), (4, 6)]
    assert even_split([], 4) == []


def test_run_chunked_returns_what_each_chunk_returns_in_chunk_order():
    seen = []

    def fn(chunk):
        seen.append(chunk)
        return [(unit, example) for _, unit, _, example in chunk.rows()]

    assert run_chunked(fn, SPANS, units_of, batch_size=4) == expected_cells()
    assert seen == plan_chunks(SPANS, units_of, batch_size=4)


def _ranked(rank: int) -> list:
    return run_chunked(lambda chunk: [(rank, chunk.start, list(chunk.units))], SPANS,
                       units_of, batch_size=4)


def test_two_ranks_each_get_the_single_process_list(tmp_path):
    single = run_ranks(_ranked, world=1, folder=tmp_path)[0]
    both = run_ranks(_ranked, world=2, folder=tmp_path)
    strip = [(start, units) for _, start, units in single]
    for got in both:  # every rank the whole list, in chunk order ...
        assert [(start, units) for _, start, units in got] == strip
    ran = [rank for rank, _, _ in both[0]]
    assert set(ran) == {0, 1}  # ... with the chunks run on both ranks, alternately
    assert ran == [i % 2 for i in range(len(ran))]
