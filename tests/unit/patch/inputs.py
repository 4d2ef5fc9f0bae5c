"""Clean / corrupted pairs and independent references for the patching tests.

- :func:`induction_pairs`: ``ref:induction`` sequences with a repeated segment (clean) and the
  same second half after a different first half (corrupt), with the second-copy positions,
  where the next token is predictable by copying and every token equals its clean twin;
- :func:`patched_one`: one patched forward through the capture parts themselves (no batching,
  no attnprobe.patch code), the reference the batched tables must equal.
"""

from __future__ import annotations

import torch

import attnprobe as ap
from attnprobe.capture import Activations, Edit, EditKey, EditOutput, EditQuery, EditValue, Live
from attnprobe.core.metric import parse_metric
from attnprobe.tasks.induction import held_out

REWRITES = {"output": (EditOutput, "z"), "pattern": (Edit, "pattern"), "q": (EditQuery, "q"),
            "k": (EditKey, "k"), "v": (EditValue, "v")}


def induction_pairs(tokenizer, n: int = 6, seq_len: int = 24, seed: int = 7
                    ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """``(clean ids, corrupt ids, second-copy positions)``, one per sequence."""
    segments = held_out(n, seq_len=seq_len)
    first = tokenizer.convert_tokens_to_ids(["t00"])[0]
    g = torch.Generator().manual_seed(seed)
    clean, corrupt, positions = [], [], []
    for row, source in zip(segments.input_ids, segments.source, strict=True):
        copy = (source >= 0).nonzero()[:, 0]
        start = int(copy[0])
        other = row.clone()
        other[1:start] = first + torch.randint(0, 64, (start - 1,), generator=g)
        clean.append(row.tolist())
        corrupt.append(other.tolist())
        positions.append(copy.tolist())
    return clean, corrupt, positions


def batch_of(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """Equal-length id rows as model inputs (no padding)."""
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def read(model, inputs, tensor: str, layer: int) -> torch.Tensor:
    """Tensor ``tensor`` of ``layer`` in a plain capture of ``inputs``."""
    part = Live() if tensor == "pattern" else Activations((tensor,))
    with torch.no_grad(), ap.capture(model, f"layer:{layer}", parts=[part]) as cap:
        model(**inputs)
    found = cap.live[0] if tensor == "pattern" else cap.activations[0]
    (value,) = [v for s, v in found.items() if s.layer == layer]
    return value if tensor == "pattern" else value[tensor]


def patched_one(model, base, other, site: str, layer: int, head: int, position=None):
    """The output of ``base`` with head ``head`` (of the site's head axis) of ``layer`` taken
    from the run on ``other`` (at ``position``, or every position)."""
    part, tensor = REWRITES[site]
    source = read(model, other, tensor, layer)

    def fn(at: int, t: torch.Tensor) -> torch.Tensor:
        if at == layer:
            if position is None:
                t[:, head] = source[:, head]
            else:
                t[:, head, position] = source[:, head, position]
        return t

    out = None
    try:
        with torch.no_grad(), ap.capture(model, f"layer:{layer}", parts=[part(fn)]):
            out = model(**base)
    except ap.EditNotAppliedError:  # the patched values equal the base run's: out is ready
        pass
    return out


def metric_values(spec, tokenizer, output, inputs, positions="last", answers=None
                  ) -> torch.Tensor:
    """``spec`` on ``output``; a metric of the next token reads ``answers``' next tokens (the
    clean batch: patching scores the clean answer in every run), else ``inputs``'."""
    metric = parse_metric(spec, tokenizer, positions=positions)
    if answers is not None:
        metric = metric.fixed(output, answers)
    return metric(output, inputs).double()
