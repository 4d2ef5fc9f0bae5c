"""The README's table of patching experiments, written from
:data:`attnprobe.patch.EXPERIMENTS` (their summaries and options)."""

from __future__ import annotations

from attnprobe.readme import ReadmePart
from attnprobe.readme.experiments import experiment_rows


def markdown() -> str:
    """One row per patching experiment: what it does and its options."""
    from attnprobe.patch import EXPERIMENTS

    return "\n".join(experiment_rows(EXPERIMENTS))


PART = ReadmePart("patch-experiments", markdown)
