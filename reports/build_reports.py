"""Build the HTML reports from the analysis runs in ``runs/`` (no model is run).

    python reports/build_reports.py [--runs runs] [--out reports/_build] [names...]

Each report reads the CSV tables of the newest run folder of its analysis that has them
(``runs/<analysis>/<UTC stamp>/``) and writes ``<out>/<name>.html``, self-contained. A report
whose runs are absent is skipped with a one-line note.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from attnprobe.report import Report, build

DEFAULT_RUNS = Path("runs")
DEFAULT_OUT = Path(__file__).resolve().parent / "_build"


def newest_run(runs: Path, analysis: str, needs: str) -> Path | None:
    """The newest ``runs/<analysis>/<stamp>/`` folder holding ``needs`` (a CSV name)."""
    base = Path(runs) / analysis
    if not base.is_dir():
        return None
    found = sorted(p for p in base.iterdir() if p.is_dir() and (p / needs).is_file())
    return found[-1] if found else None


def _csv(run_dir: Path, name: str) -> pd.DataFrame | None:
    path = Path(run_dir) / f"{name}.csv"
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _source(run_dir: Path) -> tuple[str, str, pd.DataFrame]:
    return ("source", "Source", pd.DataFrame({"run folder": [str(run_dir)]}))


def head_census(run_dir: Path) -> Report:
    """Head grid and layer profile (``labels.csv``), syntax heads (``syntax_key.csv``)."""
    labels = _csv(run_dir, "labels")
    if labels is None:
        raise FileNotFoundError(f"{run_dir}/labels.csv")
    syntax = _csv(run_dir, "syntax_key")
    if syntax is None:
        syntax = _csv(run_dir, "syntax")
    return build(census=labels, syntax=syntax, title="Head census", tables=[
        ("label-counts", "Label counts", _csv(run_dir, "label_counts")),
        ("summary", "Summary", _csv(run_dir, "summary")),
        _source(run_dir)])


def perturbation_studies(run_dir: Path) -> Report:
    """Permutation summary as the main table, then the other experiments' summaries."""
    main = _csv(run_dir, "permutation_summary")
    if main is None:
        raise FileNotFoundError(f"{run_dir}/permutation_summary.csv")
    return build(perturbation=main, title="Perturbation studies", tables=[
        ("erasure", "Erasure", _csv(run_dir, "erasure_summary")),
        ("adversarial", "Adversarial attention", _csv(run_dir, "adversarial_summary")),
        ("uniform", "Uniform attention", _csv(run_dir, "uniform")),
        ("pruning", "Head pruning", _csv(run_dir, "pruning_summary")),
        ("training", "Training", _csv(run_dir, "training")),
        ("skipped", "Skipped", _csv(run_dir, "skipped")),
        _source(run_dir)])


def attribution(run_dir: Path) -> Report:
    """A ``rollout_trend`` run (``trend.csv``) or an ``attribution_truth`` run (``truth.csv``)."""
    trend = _csv(run_dir, "trend")
    if trend is not None:
        return build(comparison=trend, title="Attribution: attention vs. gradients by layer",
                     tables=[("verdict", "Verdict", _csv(run_dir, "verdict")),
                             ("references", "References", _csv(run_dir, "references")),
                             ("checks", "Checks", _csv(run_dir, "checks")),
                             _source(run_dir)])
    truth = _csv(run_dir, "truth")
    if truth is None:
        raise FileNotFoundError(f"{run_dir}: neither trend.csv nor truth.csv")
    return build(comparison=truth, title="Attribution: ground truth", tables=[
        ("jain-wallace", "Jain & Wallace", _csv(run_dir, "jain_wallace")),
        ("training", "Training", _csv(run_dir, "training")),
        _source(run_dir)])


# name -> (function, [(analysis folder, CSV it needs), ...] in order of preference)
REPORTS: dict[str, tuple[Callable[[Path], Report], list[tuple[str, str]]]] = {
    "head_census": (head_census, [("head_census", "labels.csv")]),
    "perturbation_studies": (perturbation_studies,
                             [("perturbation_studies", "permutation_summary.csv")]),
    "attribution": (attribution, [("rollout_trend", "trend.csv"),
                                  ("attribution_truth", "truth.csv")]),
}


def build_all(runs: Path = DEFAULT_RUNS, out: Path = DEFAULT_OUT,
              names: Sequence[str] | None = None) -> dict[str, Path]:
    """Build the named reports (all when empty); returns {name: html path} of those built."""
    built: dict[str, Path] = {}
    for name in names or list(REPORTS):
        func, sources = REPORTS[name]
        run_dir = next((d for a, need in sources
                        if (d := newest_run(runs, a, need)) is not None), None)
        if run_dir is None:
            wanted = " or ".join(f"{runs}/{a}/*/{need}" for a, need in sources)
            print(f"skip {name}: no run found ({wanted})")
            continue
        built[name] = func(run_dir).save(Path(out) / f"{name}.html")
        print(f"{name}: {built[name]} (from {run_dir})")
    return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="analysis runs folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("names", nargs="*",
                        help=f"reports to build (default all): {', '.join(REPORTS)}")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in REPORTS]
    if unknown:
        parser.error(f"unknown report(s) {', '.join(unknown)}; choose from {', '.join(REPORTS)}")
    build_all(args.runs, args.out, args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
