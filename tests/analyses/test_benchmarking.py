"""analyses/harness/benchmarking.py: every expected value follows from how the inputs were built."""

import dataclasses
import json
import math
import subprocess
import sys
import time
import weakref

import pandas as pd
import pytest
from harness import benchmarking as bm

from tests.conftest import ANALYSES


def fake_raw():
    """ours 2, 5, 9 s against baseline 1, 2, 4 s in rounds 0, 1, 2."""
    rows = []
    for rep, (ours, base) in enumerate([(2.0, 1.0), (5.0, 2.0), (9.0, 4.0)]):
        rows.append({"contender": "ours", "repeat": rep, "seconds": ours,
                     "foreign_load": 0.1 * rep, "forward_s": ours / 2})
        rows.append({"contender": "base", "repeat": rep, "seconds": base,
                     "foreign_load": 0.0, "forward_s": float("nan")})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- interleaved
def test_sleeping_contender_takes_at_least_its_sleep():
    raw = bm.interleaved({"sleep": lambda: time.sleep(0.02)}, repeats=3)
    table = bm.timing_table(raw)
    assert table["median_s"].iloc[0] >= 0.02
    assert table["min_s"].iloc[0] >= 0.02 and table["repeats"].iloc[0] == 3


def test_contenders_alternate_and_warmup_rows_are_dropped():
    calls = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    raw = bm.interleaved(contenders, repeats=2, warmup=2)
    assert calls == list("abc") * 4  # warm-up rounds ran too
    assert list(raw["contender"]) == list("abc") * 2
    assert list(raw["repeat"]) == [0, 0, 0, 1, 1, 1]
    assert list(raw.columns) == ["contender", "repeat", "seconds", "foreign_load"]
    assert (raw["seconds"] >= 0).all()


def test_gc_runs_before_every_run(monkeypatch):
    events = []
    monkeypatch.setattr(bm.gc, "collect", lambda: events.append("gc"))
    bm.interleaved({"a": lambda: events.append("a"), "b": lambda: events.append("b")},
                   repeats=1, warmup=1)
    assert events == ["gc", "a", "gc", "b"] * 2


def test_labels_come_first_and_extras_become_columns():
    raw = bm.interleaved({"x": lambda: {"forward_s": 0.5, "n_maps": 3}}, repeats=2,
                         labels={"benchmark": "one"})
    assert list(raw.columns) == ["benchmark", "contender", "repeat", "seconds", "foreign_load",
                                 "forward_s", "n_maps"]
    assert (raw["benchmark"] == "one").all() and (raw["n_maps"] == 3).all()


def test_timed_s_replaces_the_wall_time():
    raw = bm.interleaved({"self-timed": lambda: {bm.TIMED_S: 123.0, "exit_s": 1.0}}, repeats=2)
    assert (raw["seconds"] == 123.0).all()
    assert bm.TIMED_S not in raw and (raw["exit_s"] == 1.0).all()


class SlowToFree:
    def __del__(self):
        time.sleep(0.05)


def test_results_are_freed_outside_the_timed_region():
    alive = []

    def contender():
        result = SlowToFree()
        alive.append(weakref.ref(result))
        return bm.Outcome({}, result)

    raw = bm.interleaved({"a": contender}, repeats=2)
    assert (raw["seconds"] < 0.05).all()  # freeing (0.05 s each) was not timed
    assert all(ref() is None for ref in alive)  # nor kept


def test_results_hold_the_last_result_of_each_contender():
    count = iter(range(100))
    results = {}
    raw = bm.interleaved({"a": lambda: bm.Outcome({"k": 1.0}, next(count)),
                          "b": lambda: bm.Outcome({}, "b")},
                         repeats=2, warmup=1, results=results)
    assert results == {"a": 2, "b": "b"}  # a ran in rounds 0 (warm-up), 1, 2
    assert list(raw.loc[raw["contender"] == "a", "k"]) == [1.0, 1.0]


def test_only_first_limits_a_slow_contender_and_skips_its_warmup():
    calls = []
    contenders = {"fast": lambda: calls.append("fast"), "slow": lambda: calls.append("slow")}
    raw = bm.interleaved(contenders, repeats=3, warmup=1, only_first={"slow": 1})
    assert calls == ["fast", "fast", "slow", "fast", "fast"]
    assert list(zip(raw["contender"], raw["repeat"], strict=True)) == [
        ("fast", 0), ("slow", 0), ("fast", 1), ("fast", 2)]


# ----------------------------------------------------------------------------- CPU load
def test_foreign_load_is_busy_time_not_ours_per_second():
    assert bm.foreign_load((10.0, 2.0), (13.0, 3.0), 2.0) == pytest.approx(1.0)
    assert bm.foreign_load((10.0, 2.0), (10.5, 3.0), 2.0) == 0.0  # never negative
    assert math.isnan(bm.foreign_load((math.nan, math.nan), (math.nan, math.nan), 1.0))
    assert math.isnan(bm.foreign_load((0.0, 0.0), (1.0, 0.0), 0.0))


def test_cpu_seconds_counts_our_own_work():
    busy0, own0 = bm.cpu_seconds()
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    busy1, own1 = bm.cpu_seconds()
    if math.isnan(busy0):
        pytest.skip("no /proc/stat")
    # /proc counts in clock ticks (10 ms): 0.1 s of work reads as at least 0.09 s, less the
    # float error of the subtraction
    assert own1 - own0 >= 0.09 - 1e-9
    assert busy1 >= busy0


def test_cpu_seconds_without_proc_is_nan(monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("no /proc")

    monkeypatch.setattr(bm, "open", missing, raising=False)
    assert all(math.isnan(x) for x in bm.cpu_seconds())


# ----------------------------------------------------------------------------- tables
def test_timing_table_by_hand():
    table = bm.timing_table(fake_raw(), baseline="base", medians=["forward_s", "absent_s"])
    assert list(table.columns) == [
        "contender", "median_s", "min_s", "max_s", "repeats", "foreign_load",
        "median_forward_s", "ratio_to_baseline", "median_paired_ratio", "extra_over_baseline_s"]
    ours, base = table.set_index("contender").loc["ours"], table.set_index("contender").loc["base"]
    assert (ours["median_s"], ours["min_s"], ours["max_s"], ours["repeats"]) == (5, 2, 9, 3)
    assert ours["foreign_load"] == pytest.approx(0.1)
    assert ours["median_forward_s"] == 2.5 and math.isnan(base["median_forward_s"])
    assert ours["ratio_to_baseline"] == 2.5  # 5 / 2
    assert ours["median_paired_ratio"] == 2.25  # median of 2/1, 5/2, 9/4
    assert ours["extra_over_baseline_s"] == 3.0
    assert base["ratio_to_baseline"] == 1.0 and base["median_paired_ratio"] == 1.0


def test_timing_table_without_baseline_groups_by_benchmark():
    one, two = fake_raw(), fake_raw()
    one["benchmark"], two["benchmark"] = "one", "two"
    two["seconds"] *= 10
    table = bm.timing_table(pd.concat([one, two]), by=["benchmark", "contender"])
    assert list(table[["benchmark", "contender"]].itertuples(index=False, name=None)) == [
        ("one", "ours"), ("one", "base"), ("two", "ours"), ("two", "base")]
    assert list(table["median_s"]) == [5, 2, 50, 20]
    assert "ratio_to_baseline" not in table


def test_timing_table_of_another_value():
    raw = fake_raw()
    raw["seconds_per_example"] = raw["seconds"] / 4
    table = bm.timing_table(raw, value="seconds_per_example", suffix="s_per_example")
    assert list(table.columns[:5]) == ["contender", "median_s_per_example",
                                       "min_s_per_example", "max_s_per_example", "repeats"]
    assert table["median_s_per_example"].iloc[0] == 1.25


def test_timing_table_rejects_an_unknown_baseline():
    with pytest.raises(ValueError, match="nobody"):
        bm.timing_table(fake_raw(), baseline="nobody")


def test_ratios_by_hand():
    assert bm.ratios(fake_raw(), "ours", "base") == {
        "ratio_of_medians": 2.5, "median_paired_ratio": 2.25, "ratio_of_mins": 2.0}


def test_paired_ratio_skips_rounds_the_baseline_missed():
    raw = fake_raw()
    raw = raw[~((raw["contender"] == "base") & (raw["repeat"] == 2))]
    assert bm.ratios(raw, "ours", "base")["median_paired_ratio"] == 2.25  # of 2/1, 5/2


def test_load_warning():
    assert bm.load_warning(0.1) is None and bm.load_warning(math.nan) is None
    message = bm.load_warning(0.5)
    assert message.startswith("WARNING: other processes kept 0.50 cores busy")
    assert bm.load_warning(0.5, threshold=1.0) is None


# ----------------------------------------------------------------------------- config, child
@dataclasses.dataclass
class Sizes(bm.FromDict):
    n: int = 1
    name: str = "x"


def test_from_dict_round_trips_and_ignores_unknown_keys():
    cfg = Sizes(n=5, name="y")
    data = {**json.loads(json.dumps(dataclasses.asdict(cfg))), "gone": 3}
    assert Sizes.from_dict(data) == cfg
    assert Sizes.from_dict({}) == Sizes()


def test_run_json_child_parses_the_last_line(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    code = ("import json, os; print('noise'); "
            "print(json.dumps({'offline': os.environ['HF_HUB_OFFLINE'], 'n': 2, "
            "'mmap': os.environ['MALLOC_MMAP_THRESHOLD_']}))")
    assert bm.run_json_child(["-c", code], timeout_s=60) == {
        "offline": "1", "n": 2, "mmap": str(1 << 20)}


def test_run_json_child_failure_shows_stderr():
    with pytest.raises(RuntimeError, match=r"probe failed with 3:\n.*boom"):
        bm.run_json_child(["-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"],
                          timeout_s=60, what="probe")


def test_import_stays_light():
    heavy = ("transformers", "captum", "matplotlib", "spacy", "seaborn", "scipy")
    code = ("import sys, harness.benchmarking; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ANALYSES)
    assert out.stdout.strip() == "[]"


def test_with_result_hands_the_return_value_back_as_the_result():
    results = {}
    raw = bm.interleaved({"a": bm.with_result(lambda: {"not": "extras"})}, repeats=1,
                         results=results)
    assert results == {"a": {"not": "extras"}}
    assert list(raw.columns) == ["contender", "repeat", "seconds", "foreign_load"]
