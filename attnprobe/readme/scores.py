"""The README's score table (``generated:scores``): one row per declared census score
(:func:`attnprobe.heads.stats.ranked_scores`), in table order."""

from __future__ import annotations

from attnprobe.heads.stats import ranked_scores
from attnprobe.readme import ReadmePart


def cell(text: str) -> str:
    """``text`` safe inside a markdown table cell (a bare ``|`` would end the cell)."""
    return text.replace("|", "\\|")


def score_markdown() -> str:
    """The score table: ``| column | meaning |``, the columns of each score in backticks."""
    lines = ["| column | meaning |", "|---|---|"]
    for score in ranked_scores():
        names = ", ".join(f"`{name}`" for name in score.name.split(", "))
        lines.append(f"| {names} | {cell(score.meaning)} |")
    return "\n".join(lines)


PART = ReadmePart("scores", score_markdown)
