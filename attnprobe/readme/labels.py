"""The README's label precedence, families and thresholds (``generated:labels``), written from
the label rules (:data:`attnprobe.heads.label_rules.RULES`): a new rule appears here by being
registered."""

from __future__ import annotations

from attnprobe.heads.label_rules import FALLBACK, FAMILIES, RULES
from attnprobe.readme import ReadmePart, bullet, paragraph
from attnprobe.readme.scores import cell


def precedence_sentence() -> str:
    """``Precedence: `a` (what fires it) > `b` (...) > ... > `heterogeneous` (no rule
    fired).`` in rank order, each rule's help with its threshold defaults filled in."""
    entries = [f"`{entry.label}` ({entry.summary()})" if entry.help else f"`{entry.label}`"
               for entry in RULES.rules()]
    return paragraph(f"Precedence: {' > '.join([*entries, f'`{FALLBACK}` (no rule fired)'])}.")


def family_list() -> str:
    """One bullet per family, in order of its first label: what it means and its labels."""
    lines = []
    for family in RULES.families():
        members = ", ".join(f"`{label}`" for label in RULES.labels_of(family))
        meaning = FAMILIES.get(family)
        lines.append(bullet(f"`{family}`: {members}{f' — {meaning}' if meaning else ''}"))
    return "\n".join(lines)


def threshold_table() -> str:
    """Every threshold the rules declare: its name, default and what it bounds."""
    lines = ["| threshold | default | read by | meaning |", "|---|---|---|---|"]
    for name, threshold in RULES.thresholds().items():
        readers = ", ".join(f"`{entry.label}`" for entry in RULES.rules()
                            if any(t.name == name for t in entry.thresholds))
        lines.append(f"| `{name}` | {threshold.default:g} | {readers} | "
                     f"{cell(threshold.help)} |")
    return "\n".join(lines)


def labels_markdown() -> str:
    """The precedence sentence, the families and the thresholds, as README paragraphs."""
    return "\n\n".join([
        precedence_sentence(),
        paragraph("Every label belongs to a **family** (the `family` column; "
                  "`ap.heads.label_counts(table)` counts heads per label grouped by family, and "
                  "the CLI summary and the report group by it):"),
        family_list(),
        paragraph("**Thresholds** (each declared by the rules that read it, with its default; "
                  "`Thresholds(name=value)` overrides any of them by name, an unknown name is "
                  "an error):"),
        threshold_table(),
    ])


PART = ReadmePart("labels", labels_markdown)
