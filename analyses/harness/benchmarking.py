"""Timing helpers the benchmark scripts (``analyses/bench_*.py``) share.

Contenders are run alternately (A, B, A, B, ...) so slow drift on a shared machine hits all of
them alike; each timed repeat records its wall seconds and the CPU load other processes put on
the machine meanwhile (``foreign_load``, in cores), which explains outliers (OpenMP threads
stall when a core is taken away). The tables then give medians, extremes and ratios to a
baseline, both as a ratio of medians and as the median of per-round paired ratios (robust to
slow drift).

>>> raw = interleaved({"ours": ours, "baseline": plain}, repeats=7, warmup=2)
>>> timing_table(raw, baseline="baseline")  # median_s, ..., ratio_to_baseline, ...

Light on purpose: only the standard library and pandas are imported (``attnprobe`` itself does
not import this module).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, NamedTuple, TypeVar

import pandas as pd

__all__ = [
    "LOAD_WARNING",
    "TIMED_S",
    "Contender",
    "Extras",
    "FromDict",
    "Outcome",
    "cpu_seconds",
    "foreign_load",
    "interleaved",
    "load_warning",
    "ratios",
    "run_json_child",
    "timing_table",
    "with_result",
]

LOAD_WARNING = 0.2  # cores of foreign CPU load above which timings are flagged
TIMED_S = "timed_s"  # extras key: the contender timed its own region; use it as the seconds

Extras = Mapping[str, float]  # extra columns of a repeat's row (sub-phase seconds, counts)


class Outcome(NamedTuple):
    """What a contender returns when it also has a result: the result is kept alive until the
    repeat is measured (so freeing it is never timed) and, with ``results=``, the last one of
    each contender is handed back."""

    extras: Extras
    result: Any = None


Contender = Callable[[], Extras | Outcome | None]  # one run of what is timed


def with_result(fn: Callable[[], Any]) -> Contender:
    """A contender from a function whose return value is a result (an output to free after
    the measurement, or to hand back through ``results=``), not extra columns."""
    return lambda: Outcome({}, fn())


# ----------------------------------------------------------------------------- measuring
def cpu_seconds() -> tuple[float, float]:
    """``(busy, own)``: CPU seconds all CPUs have spent busy (steal included; idle and iowait
    not), and CPU seconds of this process and its waited-for children. NaN off Linux."""
    try:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return float("nan"), float("nan")
    busy = sum(ticks) - ticks[3] - ticks[4]  # minus idle and iowait
    own = os.times()
    return (busy / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system)


def foreign_load(before: tuple[float, float], after: tuple[float, float],
                 seconds: float) -> float:
    """Cores other processes kept busy on average between two :func:`cpu_seconds` readings
    ``seconds`` apart (never negative; NaN where it cannot be told)."""
    if not seconds > 0:
        return float("nan")
    load = ((after[0] - before[0]) - (after[1] - before[1])) / seconds
    return max(0.0, load) if load == load else float("nan")


def interleaved(contenders: Mapping[str, Contender], *, repeats: int, warmup: int = 0,
                labels: Mapping[str, Any] | None = None,
                results: dict[str, Any] | None = None,
                only_first: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Run the contenders alternately, ``warmup`` untimed rounds then ``repeats`` timed ones.

    A contender is called with no arguments and returns ``None``, a mapping of extra columns
    (``Extras``) or an :class:`Outcome` (extras and a result). Each run is preceded by
    ``gc.collect()``. Its seconds are the wall time of the call, unless the extras hold
    ``TIMED_S``: then that value (the contender timed a region of its own) and it is no column.

    ``labels``: constant columns put first in every row (e.g. ``{"benchmark": name}``).
    ``results``: when given, ``results[name]`` is set to the last result of each contender.
    ``only_first``: ``{name: n}`` for a contender too slow to repeat: it runs in the first
    ``n`` timed rounds only and skips the warm-up.

    Returns one row per timed run: the labels, ``contender``, ``repeat`` (0-based, the round:
    rows of one round are paired), ``seconds``, ``foreign_load`` and the extras.
    """
    limits = dict(only_first or {})
    rows: list[dict[str, Any]] = []
    for rnd in range(warmup + repeats):
        rep = rnd - warmup
        for name, fn in contenders.items():
            if name in limits and not 0 <= rep < limits[name]:
                continue
            gc.collect()
            before = cpu_seconds()
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
            after = cpu_seconds()
            result = None
            if isinstance(out, Outcome):
                out, result = out.extras, out.result
            extras = dict(out or {})
            seconds = float(extras.pop(TIMED_S, seconds))
            if results is not None:
                results[name] = result
            del result  # freed outside the timed region, for every contender alike
            if rep >= 0:
                rows.append({**(labels or {}), "contender": name, "repeat": rep,
                             "seconds": seconds,
                             "foreign_load": foreign_load(before, after, seconds), **extras})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- tables
def _paired(raw: pd.DataFrame, contender: str, baseline: str, value: str) -> pd.Series:
    """Per round: ``contender / baseline`` of the same round (rounds only one ran in: NaN)."""
    ours = raw[raw["contender"] == contender].set_index("repeat")[value]
    base = raw[raw["contender"] == baseline].set_index("repeat")[value]
    return ours / base


def timing_table(raw: pd.DataFrame, baseline: str | None = None, *,
                 by: Sequence[str] = ("contender",), medians: Sequence[str] = (),
                 value: str = "seconds", suffix: str = "s") -> pd.DataFrame:
    """Summary of :func:`interleaved` rows, one row per group of ``by`` (first-seen order).

    Columns: ``by``, ``median_<suffix>``, ``min_<suffix>``, ``max_<suffix>`` of ``value``,
    ``repeats``, ``foreign_load`` (mean, where recorded), ``median_<c>`` for each column ``c``
    of ``medians`` that ``raw`` has; with a ``baseline`` contender also ``ratio_to_baseline``
    (ratio of medians), ``median_paired_ratio`` (median over rounds of ours / baseline of the
    same round) and ``extra_over_baseline_s`` (difference of medians). With a baseline the
    rows must be of one benchmark (``raw`` filtered, or ``by=("contender",)``).
    """
    by = list(by)
    grouped = raw.groupby(by, sort=False)
    stats: dict[str, tuple[str, str]] = {
        f"median_{suffix}": (value, "median"), f"min_{suffix}": (value, "min"),
        f"max_{suffix}": (value, "max"), "repeats": (value, "size")}
    if "foreign_load" in raw:
        stats["foreign_load"] = ("foreign_load", "mean")
    table = grouped.agg(**stats)
    for column in medians:
        if column in raw:
            table[f"median_{column}"] = grouped[column].median()
    table = table.reset_index()
    if baseline is not None:
        base = raw.loc[raw["contender"] == baseline, value]
        if base.empty:
            raise ValueError(f"baseline {baseline!r} is not among the contenders")
        table["ratio_to_baseline"] = table[f"median_{suffix}"] / base.median()
        table["median_paired_ratio"] = [
            float(_paired(raw, name, baseline, value).median()) for name in table["contender"]]
        table["extra_over_baseline_s"] = table[f"median_{suffix}"] - base.median()
    return table


def ratios(raw: pd.DataFrame, contender: str, baseline: str,
           value: str = "seconds") -> dict[str, float]:
    """``contender`` over ``baseline`` three ways: ``ratio_of_medians`` (the headline),
    ``median_paired_ratio`` (median of per-round ratios; robust to slow drift) and
    ``ratio_of_mins``."""
    ours = raw.loc[raw["contender"] == contender, value]
    base = raw.loc[raw["contender"] == baseline, value]
    return {"ratio_of_medians": float(ours.median() / base.median()),
            "median_paired_ratio": float(_paired(raw, contender, baseline, value).median()),
            "ratio_of_mins": float(ours.min() / base.min())}


def load_warning(load: float, threshold: float = LOAD_WARNING) -> str | None:
    """The warning to print when other processes kept more than ``threshold`` cores busy on
    average (``load``, e.g. ``raw["foreign_load"].mean()``); ``None`` otherwise."""
    if not load > threshold:
        return None
    return (f"WARNING: other processes kept {load:.2f} cores busy on average during the timed "
            f"repeats (of {os.cpu_count()}); timings and ratios are not trustworthy.")


# ----------------------------------------------------------------------------- child runs
MMAP_THRESHOLD = 1 << 20  # bytes; larger allocations always go to (and back from) mmap


def run_json_child(args: Sequence[str], *, timeout_s: float, what: str = "child",
                   env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python *args`` in a fresh process (Hugging Face offline and quiet) and parse the
    last line it prints as JSON: a measurement no heap of this process can distort.

    The child's glibc gets a fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_`` = 1 MiB, unless
    set already): by default glibc raises the threshold each time a large block is freed, so
    the next 16 MiB blocks come from the heap, which fragments and is not given back — peak
    RSS then measures fragmentation (seen: 60 MiB or 900 MiB for the same streaming run)
    rather than what the code holds. ``env``: more variables for the child (they win).

    Raises ``RuntimeError`` with the end of its stderr when it fails.
    """
    child_env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    child_env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    child_env.update(env or {})
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout_s, env=child_env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed with {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


T = TypeVar("T", bound="FromDict")


class FromDict:
    """Mixin for a benchmark's ``@dataclass Config``: rebuild it from ``asdict()`` output
    (e.g. JSON handed to a child process); keys it has no field for are ignored."""

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
