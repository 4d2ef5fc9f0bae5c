"""Rewrite the README's score table from the score declarations (:mod:`attnprobe.heads.stats`).

Run: ``make readme`` (a test fails while the README and the declarations disagree).
"""

from __future__ import annotations

from pathlib import Path

from attnprobe.core.display import replace_marked
from attnprobe.heads.scores import SCORE_MARKERS, score_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    README.write_text(replace_marked(README.read_text(), score_markdown(), *SCORE_MARKERS))
    print(f"rewrote the score table in {README}")


if __name__ == "__main__":
    main()
