"""``attnprobe faithfulness``: the per-example table, the summary, the curves and the figure
equal the Python call; the removal is recorded in every row; bad input is one line."""

from __future__ import annotations

import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.faithfulness.result import CURVE_COLUMNS, TABLE_COLUMNS
from tests.helpers import run_cli as run

MODEL = "ref:transformer-classifier"  # untrained, 2 classes, key-token vocabulary
TEXTS = ["key cat the dog red", "a big tree and the sun"]
SOURCES = ("saliency", "leave_one_out")


@pytest.fixture(scope="module")
def classifier():
    return ap.load_model(MODEL)


def base(tmp_path, *extra: str) -> list[str]:
    return ["faithfulness", "--model", MODEL, *(a for t in TEXTS for a in ("--text", t)),
            "--target", "class:1", "--methods", ",".join(SOURCES), "--views", "raw",
            "--levels", "0.2,0.5", "--out", str(tmp_path / "rows.csv"), *extra]


def _frame(path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"example_id": str, "note": str}, keep_default_na=True)


def test_tables_and_figure_equal_the_python_call(tmp_path, capsys, classifier):
    argv = base(tmp_path, "--curve-steps", "4", "--summary", str(tmp_path / "summary.csv"),
                "--curves", str(tmp_path / "curves.csv"), "--plot", str(tmp_path / "f.svg"),
                "--quiet")
    code, printed, err = run(argv, capsys)
    assert code == 0 and err == ""
    model, tok = classifier
    want = ap.faithfulness.evaluate(model, tok, TEXTS, "class:1", methods=list(SOURCES),
                                    views=["raw"], levels=(0.2, 0.5), curve_steps=4)
    table = _frame(tmp_path / "rows.csv")
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert set(table.source) == {*SOURCES, "raw@L1", "random"}
    assert (table.removal == "delete").all() and (table.target == "class:1").all()
    expected = want.table.reset_index(drop=True)
    for column in ("example_id", "source", "metric"):
        assert table[column].tolist() == expected[column].astype(str).tolist()
    # float32 outputs written as text and read back: equal to the last printed digit
    pd.testing.assert_series_equal(table.value, expected.value.astype(float),
                                   check_exact=False, rtol=1e-12, atol=0)
    curves = _frame(tmp_path / "curves.csv")
    assert list(curves.columns) == list(CURVE_COLUMNS)
    assert sorted(curves.fraction.unique()) == [0.0, 0.25, 0.5, 0.75, 1.0]  # 4 steps + 0
    pd.testing.assert_series_equal(curves.value, want.curves_table.value.astype(float),
                                   check_exact=False, rtol=1e-12, atol=0)
    summary = pd.read_csv(tmp_path / "summary.csv")
    pd.testing.assert_frame_equal(summary, want.summary(), check_dtype=False,
                                  check_exact=False, rtol=1e-12, atol=1e-15)
    assert (tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
    # the printout: the ranking, best first, as the summary ranks it
    assert printed.splitlines()[0].startswith("2 texts, target class:1, removal delete")
    ranked = [line.split()[1] for line in printed.splitlines()[2:]]
    assert ranked == want.summary()["source"].tolist()


@pytest.mark.parametrize(("flags", "label"), [
    (("--removal", "attention"), "attention"),
    (("--removal", "replace", "--fill", "unk"), "replace:[UNK]"),
])
def test_the_removal_is_recorded_in_every_row(tmp_path, capsys, flags, label):
    code, _, _ = run(base(tmp_path, "--curve-steps", "all", "--quiet", "--curves",
                          str(tmp_path / "c.csv"), *flags), capsys)
    assert code == 0
    assert set(_frame(tmp_path / "rows.csv").removal) == {label}
    curves = _frame(tmp_path / "c.csv")
    assert set(curves.removal) == {label}
    # --curve-steps all: every count of real tokens, 0..n, for each text
    ks = curves.groupby("example_id").k.agg(lambda k: sorted(set(k)))
    assert all(k == list(range(len(k))) for k in ks)


@pytest.mark.parametrize(("extra", "message"), [
    (("--levels", "a,b"), "expected comma-separated shares"),
    (("--levels", "0.5,1.5"), "1.5"),
    (("--plot", "f.gif"), "--plot must end in .png, .svg, .pdf"),
    (("--randomize", "1"), "--randomize applies to the sanity check"),
    (("--sanity-threshold", "0.3"), "--sanity-threshold applies to the sanity check"),
    (("--fill", "mask"), "--fill applies to --removal replace"),
    (("--methods", "nope"), "nope"),
    (("--curve-steps", "0"), "expected a number >= 1"),
    (("--removal", "erase"), "invalid choice"),
    (("--budget", "10"), "budget=10"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, message):
    code, printed, err = run(base(tmp_path, "--quiet", *extra), capsys)
    assert code == 2 and printed == ""
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "rows.csv").exists()


def test_colliding_outputs_are_refused_before_the_run(tmp_path, capsys):
    same = str(tmp_path / "rows.csv")
    code, _, err = run(base(tmp_path, "--summary", same), capsys)
    assert code == 2 and err.count("\n") == 1 and "--summary" in err


def test_help_lists_the_registered_sources(capsys):
    from attnprobe.attribution.method_base import METHODS
    from attnprobe.attribution.view_base import VIEWS

    code, printed, _ = run(["faithfulness", "--help"], capsys)
    assert code == 0
    flat = " ".join(printed.split())
    for name in (*METHODS.names(), *VIEWS.names()):
        assert name in flat, name
