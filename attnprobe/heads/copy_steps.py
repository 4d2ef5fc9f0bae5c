"""Copy steps: the positions of a context whose next token is copied from earlier in it
(the input of :mod:`attnprobe.heads.retrieval`).

A task says where its copy steps are (:class:`CopyTask`: ``target[i] = w``, ``source`` marks
the span ``w`` is read from), or they are found in plain texts (:func:`find_copy_steps`: the
next token continues an earlier occurrence of the last ``min_match`` tokens — an
induction-style copy). :func:`as_copy_steps` checks either and leaves out what the model
cannot take; :class:`CopySteps` holds the result and cuts it into batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from attnprobe.core.checks import check_number
from attnprobe.core.display import counted, describe
from attnprobe.errors import InputError
from attnprobe.inputs.text import (
    Text,
    TokenIds,
    Truncation,
    check_inputs,
    encode,
    max_length_of,
    token_lengths,
    truncation_mode,
)

__all__ = ["MASK_CELLS", "CopySteps", "CopyTask", "as_copy_steps", "find_copy_steps"]

MASK_CELLS = 2**26  # padded batch x length² above which examples of other lengths wait


class CopyTask(Protocol):
    """What a copy task gives (e.g. :class:`attnprobe.tasks.needle.Needles`); every tensor is
    ``[example, seq]``, right-padded, indexed by token position:

    - ``input_ids`` (long) and ``attention_mask`` (1 = real token);
    - ``target`` (long): at a copy step the id of the token to be copied next, else -1 (the
      token need not be in ``input_ids``: the last position of a prompt is a copy step too);
    - ``source`` (bool): the positions a copy may be read from (the needle).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target: torch.Tensor
    source: torch.Tensor


@dataclass(frozen=True)
class CopySteps:
    """A checked :class:`CopyTask` (fields as there), split into batches by :meth:`batches`;
    ``ids`` names the examples (their index in the caller's task, or ``skipped``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target: torch.Tensor
    source: torch.Tensor
    ids: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def __repr__(self) -> str:
        lengths = self.lengths
        return describe("CopySteps", counted(len(lengths), "example"),
                        f"up to {counted(int(lengths.max()) if len(lengths) else 0, 'token')}",
                        counted(self.n_steps, "copy step"),
                        f"{counted(len(self.skipped), 'example')} skipped" if self.skipped
                        else None)

    @property
    def lengths(self) -> torch.Tensor:
        """``[example]`` real tokens of each example."""
        return self.attention_mask.sum(-1)

    @property
    def n_steps(self) -> int:  # copy steps in all examples
        return int((self.target >= 0).sum())

    def batches(self, batch_size: int) -> list[CopySteps]:
        """At most ``batch_size`` examples per batch, longest first, cut to their longest.

        Examples of different lengths share a batch only while ``batch x length²`` stays
        under :data:`MASK_CELLS`: transformers builds a ``[batch, 1, query, key]`` mask for a
        padded batch, which for long contexts would hold what streaming avoids.
        """
        check_number("batch_size", batch_size, integer=True, minimum=1)
        lengths = self.lengths.tolist()
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        groups: list[list[int]] = []
        for i in order:
            group = groups[-1] if groups else None
            if group is not None and len(group) < batch_size and (
                    lengths[i] == lengths[group[0]]
                    or (len(group) + 1) * lengths[group[0]] ** 2 <= MASK_CELLS):
                group.append(i)
            else:
                groups.append([i])
        out = []
        for group in groups:
            index, width = torch.tensor(group), lengths[group[0]]
            out.append(CopySteps(self.input_ids[index, :width],
                                 self.attention_mask[index, :width],
                                 self.target[index, :width], self.source[index, :width],
                                 tuple(self.ids[i] for i in group)))
        return out


def find_copy_steps(ids: Sequence[int], *, min_match: int = 4
                    ) -> tuple[list[int], list[bool]]:
    """Induction-style copy steps of one token sequence.

    Position ``i`` is a copy step when the ``min_match`` tokens ending at ``i`` occurred
    earlier, ending at ``j < i``, and the token after them equals the next one
    (``ids[j + 1] == ids[i + 1]``); its source positions are every such ``j + 1``.

    Returns ``target`` (``ids[i + 1]`` at a copy step, else -1) and ``source`` (positions some
    step copies from), each of ``len(ids)``. Linear time: each source is marked once.

    Example:
        >>> target, source = find_copy_steps([5, 6, 7, 8, 5, 6, 7, 8], min_match=2)
        >>> target          # 5 6 seen before, then 7; 6 7 seen before, then 8
        [-1, -1, -1, -1, -1, 7, 8, -1]
        >>> [i for i, s in enumerate(source) if s]      # where those 7 and 8 were read from
        [2, 3]
    """
    check_number("min_match", min_match, integer=True, minimum=1)
    ids = [int(t) for t in ids]
    n = len(ids)
    target, source = [-1] * n, [False] * n
    # (last min_match tokens, next token) -> positions j + 1 they were followed at, and how
    # many of those are already marked as sources
    seen: dict[tuple[tuple[int, ...], int], list] = {}
    for i in range(min_match - 1, n - 1):
        gram = tuple(ids[i - min_match + 1:i + 1])
        group = seen.get((gram, ids[i + 1]))
        if group is not None:
            target[i] = ids[i + 1]
            positions, marked = group
            for p in positions[marked:]:
                source[p] = True
            group[1] = len(positions)
        else:
            group = seen[(gram, ids[i + 1])] = [[], 0]
        group[0].append(i + 1)
    return target, source


def _steps_from_texts(model: nn.Module, tokenizer: Any, texts: Sequence[Text],
                      labels: Sequence[str], min_match: int) -> CopySteps:
    """Tokenise each text (they fit the model: checked before) and find its copy steps."""
    rows = []
    for text in texts:
        batch = encode(model, tokenizer, [text])
        rows.append(batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist())
    width = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    target = torch.full_like(input_ids, -1)
    source = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, row in enumerate(rows):
        n = len(row)
        input_ids[b, :n] = torch.tensor(row)
        mask[b, :n] = 1
        found_target, found_source = find_copy_steps(row, min_match=min_match)
        target[b, :n] = torch.tensor(found_target)
        source[b, :n] = torch.tensor(found_source)
    return CopySteps(input_ids, mask, target, source, tuple(labels))


def _fitting(lengths: Sequence[int], labels: Sequence[str], limit: int | None,
             mode: str) -> list[int]:
    """Indices of the examples the model takes; a longer one is an error (``"error"``) or
    left out (``"skip"``)."""
    long = [i for i, n in enumerate(lengths) if limit is not None and n > limit]
    if long and mode == "error":
        i = long[0]
        raise InputError(f"example {labels[i]} has {lengths[i]} tokens but the model takes at "
                         f"most {limit} positions; shorten it or pass truncation='skip'")
    if len(long) == len(lengths):
        raise InputError(f"every example is longer than the model allows ({limit} tokens); "
                         "nothing is left after truncation='skip'")
    return [i for i in range(len(lengths)) if i not in set(long)]


def _checked(task: Any) -> CopySteps:
    """The task's four tensors, checked (shapes, dtypes, right padding, steps on real
    tokens)."""
    names = ("input_ids", "attention_mask", "target", "source")
    missing = [n for n in names if not isinstance(getattr(task, n, None), torch.Tensor)]
    if missing:
        raise InputError(f"a copy task needs tensors {', '.join(names)}; "
                         f"{type(task).__name__} lacks {', '.join(missing)}")
    ids, mask, target, source = (getattr(task, n) for n in names)
    shapes = [tuple(t.shape) for t in (ids, mask, target, source)]
    if ids.ndim != 2 or len(set(shapes)) > 1:
        raise InputError(f"{', '.join(names)} must all be [example, seq]; got {shapes}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InputError("the copy task has no example")
    if source.dtype != torch.bool:
        raise InputError(f"source must be a bool tensor; got {source.dtype}")
    if target.dtype != torch.long or ids.dtype != torch.long:
        raise InputError("input_ids and target must be long tensors")
    real = mask.bool()
    if (real[:, 1:] & ~real[:, :-1]).any() or not real[:, 0].all():
        raise InputError("the copy task must be right-padded, with at least one real token "
                         "per example (attention_mask 1...1 0...0)")
    if (target < -1).any():
        raise InputError("target must be a token id, or -1 where a position is no copy step")
    if ((target >= 0) & ~real).any():
        raise InputError("a copy step sits on padding (target >= 0 where attention_mask is 0)")
    labels = tuple(getattr(task, "ids", ()) or ()) or tuple(str(i) for i in range(len(ids)))
    return CopySteps(ids.cpu(), real.long().cpu(), target.cpu(), (source & real).cpu(),
                     labels)


def as_copy_steps(model: nn.Module, tokenizer: Any, task: Sequence[Text] | CopyTask | Any, *,
               truncation: Truncation = "error", min_match: int = 4) -> CopySteps:
    """The checked copy steps of a task or of texts (:func:`find_copy_steps`), without the
    examples longer than the model takes (``truncation="skip"``; ``"error"`` names the first;
    a copy task cannot be cut). Raises InputError when no copy step is left."""
    mode = truncation_mode(truncation)
    if mode == "cut":
        raise InputError("a copy task cannot be cut (its copy steps sit at the end); use "
                         "truncation='skip' to leave long examples out, or 'error'")
    limit = max_length_of(model, tokenizer)
    # texts: strings or token ids (lists, a 2-D tensor, a tokenizer output); a task has steps
    texts = isinstance(task, (str, list, tuple, torch.Tensor, Mapping, TokenIds))
    if texts:
        found = check_inputs(task)
        if tokenizer is None and any(isinstance(t, str) for t in found):
            raise InputError("texts need a tokenizer; pass the model's tokenizer")
        labels = [str(i) for i in range(len(found))]
        keep = _fitting(token_lengths(tokenizer, found, model=model), labels, limit, mode)
        check_number("min_match", min_match, integer=True, minimum=1)
        steps = _steps_from_texts(model, tokenizer, [found[i] for i in keep],
                                  [labels[i] for i in keep], min_match)
    else:
        steps = _checked(task)
        labels = list(steps.ids)
        keep = _fitting(steps.lengths.tolist(), labels, limit, mode)
        index = torch.tensor(keep)
        steps = CopySteps(steps.input_ids[index], steps.attention_mask[index],
                          steps.target[index], steps.source[index],
                          tuple(labels[i] for i in keep))
    skipped = tuple(label for i, label in enumerate(labels) if i not in set(keep))
    if steps.n_steps == 0:
        how = f"no run of {min_match} tokens recurs with the same next token" if texts \
            else "target is -1 everywhere"
        raise InputError(f"the retrieval task has no copy step ({how}); a copy step is a "
                         "position whose next token is copied from earlier in the context")
    return CopySteps(steps.input_ids, steps.attention_mask, steps.target, steps.source,
                     steps.ids, skipped)
