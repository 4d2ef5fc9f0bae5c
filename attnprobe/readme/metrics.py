"""The README's table of metric kinds ("What is measured"), written from
:data:`~attnprobe.core.metric_kind.METRIC_KINDS`."""

from __future__ import annotations

from attnprobe.core.metric_kind import metric_kinds
from attnprobe.readme import ReadmePart

# not a kind: parse_metric's own path for a function
CALLABLE = ("| a callable | `(output, batch) -> Tensor[batch]`, recorded as `custom`; a callable "
            "of one argument (TransformerLens' `lambda logits: ...`) gets the logits "
            "`[batch, seq, vocab]`; any other signature is a one-line error "
            "| `lambda logits: logits[:, -1, 5]` |")


def markdown() -> str:
    """One row per kind (its forms, its help and its example), then the callable row."""
    rows = ["| metric | the number per text (a mean over `positions=` / `--positions`) "
            "| example |", "|---|---|---|"]
    rows += [f"| {', '.join(f'`{form}`' for form in kind.forms)} | {kind.help} "
             f"| `{kind.example}` |" for kind in metric_kinds()]
    return "\n".join([*rows, CALLABLE])


PART = ReadmePart("metrics", markdown)
