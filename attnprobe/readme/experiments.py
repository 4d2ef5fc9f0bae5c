"""The README's table of perturbation experiments, written from
:data:`attnprobe.perturb.EXPERIMENTS` (their summaries, options, sweeps and metrics);
:func:`experiment_rows` writes the rows of the patching table too
(:mod:`attnprobe.readme.patch_experiments`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields

from attnprobe.core.experiments import Experiment, ExperimentRegistry
from attnprobe.core.options import option_flag
from attnprobe.readme import ReadmePart


def options_cell(spec: Experiment) -> str:
    """The experiment's options as ``name`` (default; ``--flag``), or "none"."""
    cells = []
    for f in fields(spec.params):
        default = None if f.default is MISSING else f.default
        if isinstance(default, tuple):
            default = ",".join(default)
        cells.append(f"`{f.name}` ({'none' if default is None else default}; "
                     f"`{option_flag(f.name, f.metadata)}`)")
    return ", ".join(cells) or "none"


def experiment_rows(registry: ExperimentRegistry,
                    extra: dict[str, Callable[[Experiment], str]] | None = None) -> list[str]:
    """A markdown table: experiment, summary, options, then one column per ``extra``
    (header -> cell of an experiment), in rank order."""
    extra = extra or {}
    header = ["experiment", "what it does", "its options (default; flag)", *extra]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for spec in registry.values():
        cells = [f"`{spec.name}`", spec.summary.replace("|", "\\|"), options_cell(spec),
                 *(cell(spec) for cell in extra.values())]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def markdown() -> str:
    """One row per perturbation experiment: what it does, its options, whether it sweeps and
    whether it takes a scalar metric."""
    from attnprobe.perturb import EXPERIMENTS, reads_metric

    rows = experiment_rows(EXPERIMENTS, {
        "`sweep=`": lambda spec: "yes" if spec.sweeps else "",
        "`metric=`": lambda spec: "yes" if reads_metric(spec.name) else "refused",
    })
    return "\n".join(rows)


PART = ReadmePart("perturb-experiments", markdown)
