"""Copying in context, the task of ``ref:induction``: held-out data, scores and copy steps.

The model (:mod:`attnprobe.models.induction`) reads ``[BOS]`` and random symbols in which one
segment is repeated later (:func:`~attnprobe.models.induction.repeated_segments`). Only the
second copy is predictable, by looking up the earlier copy; the first copy's matching positions
are the control (predictable by chance only). This module gives what every analysis of that
circuit needs:

- :func:`held_out`: sequences drawn from a seed that the training run never used;
- :func:`segment_texts` / :func:`prefix_text`: the same sequences as texts for the
  text-based API (the tokenizer prepends ``[BOS]`` again, so the ids are identical);
- :func:`copy_scores`: next-token accuracy and loss on the second copy next to the first
  copy's matching positions, for whatever forward the model runs (e.g. inside
  :func:`attnprobe.perturb.perturbed`);
- :func:`copy_task`: the same second-copy positions as a copy task, for
  :func:`attnprobe.heads.retrieval_scores` and :func:`attnprobe.heads.copy_accuracy`;
- :func:`copy_steps`: second-copy positions ``i`` with the position ``source`` of the same
  token in the first copy, so the token to predict sits at ``source + 1`` — the ground truth
  of an attribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.induction import Recipe, Segments, induction_tokenizer, repeated_segments
from attnprobe.models.tokenizer import WordTokenizer

__all__ = ["HELD_OUT_SEED", "CopyStep", "SecondCopies", "copy_scores", "copy_steps", "copy_task",
           "held_out", "prefix_text", "segment_texts"]

HELD_OUT_SEED = 1000  # training draws its data from recipe.seed + 1 (1 for the default recipe)
HALVES = ("first", "second")


def held_out(n: int, seed: int = HELD_OUT_SEED, *, tokenizer: WordTokenizer | None = None,
             recipe: Recipe | None = None, seq_len: int | None = None) -> Segments:
    """``n`` evaluation sequences of the training distribution, from their own seed.

    Training draws every batch from one generator seeded ``recipe.seed + 1``; that seed is
    refused here, since it would replay the first training batches. ``recipe``: the
    training recipe (default :class:`~attnprobe.models.induction.Recipe`); ``seq_len``
    overrides its length.

    Example:
        >>> segments = held_out(4, tokenizer=lm_tok)    # 4 sequences of ref:induction's data
        >>> segments.input_ids.shape                    # [sequence, Recipe().seq_len]
        torch.Size([4, 48])
        >>> bool((segments.input_ids[:, 0] == lm_tok.bos_token_id).all())
        True
        >>> torch.equal(held_out(4, tokenizer=lm_tok).input_ids, segments.input_ids)  # seeded
        True
    """
    recipe = recipe if recipe is not None else Recipe()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"n must be a positive integer; got {n!r}")
    if seed == recipe.seed + 1:
        raise InputError(f"seed {seed} is the training data's seed (recipe.seed + 1): it "
                         "would replay training sequences; pick another")
    tokenizer = tokenizer if tokenizer is not None else induction_tokenizer(recipe.max_len)
    generator = torch.Generator().manual_seed(seed)
    return repeated_segments(n, generator, tokenizer, recipe, seq_len=seq_len)


def _check_bos(segments: Segments, tokenizer: Any) -> None:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or not bool((segments.input_ids[:, 0] == bos).all()):
        raise InputError("every sequence must start with the tokenizer's [BOS] (the texts "
                         "leave it out and the tokenizer puts it back)")


def segment_texts(segments: Segments, tokenizer: Any) -> list[str]:
    """One text per sequence: its symbols after ``[BOS]``, space separated (the tokenizer
    prepends ``[BOS]``, so encoding a text gives the sequence's ids back)."""
    _check_bos(segments, tokenizer)
    return [" ".join(tokenizer.convert_ids_to_tokens(row[1:].tolist()))
            for row in segments.input_ids]


@dataclass(frozen=True)
class CopyStep:
    """One second-copy position: ``example`` (row), ``position`` ``i`` (the query, the last
    token of the prefix ``0..i``), ``source`` (the same token's position in the first copy).
    The token to predict after ``i`` equals the one at ``target = source + 1``."""

    example: int
    position: int
    source: int

    @property
    def target(self) -> int:
        return self.source + 1


def copy_steps(segments: Segments, *, per_sequence: int | None = 1,
               seed: int = 0) -> list[CopyStep]:
    """Second-copy positions drawn uniformly from each sequence (``per_sequence`` of them,
    without replacement, in position order; ``None``: every one).

    Example:
        >>> segments = held_out(4, tokenizer=lm_tok)
        >>> steps = copy_steps(segments)                # one per sequence
        >>> len(steps)
        4
        >>> ids = segments.input_ids
        >>> all(ids[s.example, s.position] == ids[s.example, s.source]      # the same token
        ...     and ids[s.example, s.position + 1] == ids[s.example, s.target] for s in steps)
        True
    """
    if per_sequence is not None and (isinstance(per_sequence, bool)
                                     or not isinstance(per_sequence, int) or per_sequence < 1):
        raise InputError(f"per_sequence must be a positive integer or None; got "
                         f"{per_sequence!r}")
    generator = torch.Generator().manual_seed(seed)
    steps = []
    for b in range(segments.input_ids.shape[0]):
        positions = segments.second_half[b].nonzero()[:, 0]
        if len(positions) == 0:
            continue
        if per_sequence is not None and per_sequence < len(positions):
            pick = torch.randperm(len(positions), generator=generator)[:per_sequence]
            positions = positions[pick.sort().values]
        steps.extend(CopyStep(b, int(i), int(segments.source[b, i])) for i in positions)
    if not steps:
        raise InputError("no sequence has a second-copy position (no copy step to explain)")
    return steps


def prefix_text(segments: Segments, tokenizer: Any, step: CopyStep) -> str:
    """The text of ``input_ids[step.example, :step.position + 1]`` without ``[BOS]``: its
    last token is the query whose next token copies ``step.target``.

    Example:
        >>> segments = held_out(1, tokenizer=lm_tok)
        >>> step = copy_steps(segments)[0]
        >>> text = prefix_text(segments, lm_tok, step)
        >>> len(text.split()) == step.position          # tokens 1..position; [BOS] left out
        True
        >>> ids = lm_tok([text], return_tensors="pt")["input_ids"]     # [BOS] put back
        >>> torch.equal(ids[0], segments.input_ids[0, :step.position + 1])
        True
    """
    _check_bos(segments, tokenizer)
    n_sequences, seq_len = segments.input_ids.shape
    if not (0 <= step.example < n_sequences and 0 < step.position < seq_len
            and int(segments.source[step.example, step.position]) == step.source >= 0):
        raise InputError(f"{step} is not a second-copy position of these segments")
    ids = segments.input_ids[step.example, 1:step.position + 1]
    return " ".join(tokenizer.convert_ids_to_tokens(ids.tolist()))


def _logits(output: Any) -> torch.Tensor:
    logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise InputError(f"the model must return logits [batch, seq, vocab]; got "
                         f"{type(output).__name__}")
    return logits


@dataclass(frozen=True)
class SecondCopies:
    """The second-copy positions of :class:`Segments` as a copy task (the fields of
    :class:`attnprobe.heads.copy_steps.CopyTask`, each ``[example, seq]``): ``target`` is the
    next token at every position :func:`copy_scores` scores as ``second``, -1 elsewhere;
    ``source`` marks the first copy's span it is read from."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target: torch.Tensor
    source: torch.Tensor


def copy_task(segments: Segments) -> SecondCopies:
    """``segments`` as a copy task on exactly the positions :func:`copy_scores` scores as
    ``second``, so ``ap.heads.copy_accuracy(model, tok, copy_task(segments))`` pooled over
    examples (``correct.sum() / copy_steps.sum()``) is ``copy_scores``' second-copy accuracy.

    Example:
        >>> segments = held_out(4, tokenizer=lm_tok)
        >>> task = copy_task(segments)                  # fields [example, seq]
        >>> scored = copy_scores(lm, segments).set_index("half")
        >>> acc = ap.heads.copy_accuracy(lm, lm_tok, task)
        >>> int(acc["copy_steps"].sum()) == int(scored.loc["second", "positions"])
        True
        >>> bool(np.isclose(acc["correct"].sum() / acc["copy_steps"].sum(),
        ...                 scored.loc["second", "accuracy"]))
        True
    """
    ids = segments.input_ids
    steps = segments.second_half.clone()
    steps[:, -1] = False  # the last position has no next token to score
    target = torch.full_like(ids, -1)
    target[:, :-1] = torch.where(steps[:, :-1], ids[:, 1:], -1)
    source = torch.zeros_like(steps)
    rows, cols = steps.nonzero(as_tuple=True)
    source[rows, segments.source[rows, cols] + 1] = True  # the token after the earlier copy
    return SecondCopies(ids, torch.ones_like(ids), target, source)


def copy_scores(model: nn.Module, segments: Segments, *, batch_size: int = 64) -> pd.DataFrame:
    """Next-token accuracy and loss on the second copy and on the first copy's matching
    positions, as the model runs now (so an ablation context around the call is measured).

    Position ``i`` predicts ``input_ids[:, i + 1]`` from the logits at ``i`` ``[batch, seq,
    vocab]`` (teacher forcing, greedy argmax); ``second`` scores the positions of
    :attr:`Segments.second_half` — every position of the second copy but its last, from the
    copy's first token on — and ``first`` those of :attr:`Segments.first_half` (the same
    tokens, before any copy exists). Accuracy is pooled over all positions.

    This is not :func:`attnprobe.heads.copy_accuracy` on :func:`segment_texts`: that finds
    copy steps in texts by a match of ``min_match`` (4) tokens, so it skips the first three
    positions of each second copy (unless the tokens before it repeat by chance), among them
    the copy's first token — the hardest position, where the model has only that one token
    to match and the random prefix often holds it more than once — and it gives one accuracy
    per example (their plain mean weighs short copies up). On :func:`copy_task` it scores
    exactly these positions, with the same argmax (both teacher-forced).

    Returns:
        Two rows, ``half`` ``first`` / ``second``: ``accuracy`` (share of argmax = next
        token), ``loss`` (mean cross-entropy, nats) and ``positions`` (how many were scored).

    Example:
        >>> segments = held_out(4, tokenizer=lm_tok)
        >>> scores = copy_scores(lm, segments)
        >>> scores.columns.tolist(), scores["half"].tolist()
        (['half', 'accuracy', 'loss', 'positions'], ['first', 'second'])
        >>> int(scores["positions"].iloc[1]) == int(segments.second_half[:, :-1].sum())
        True
        >>> with ap.perturb.perturbed(lm, "zero", scope="layer:1"):   # ablate layer 1
        ...     ablated = copy_scores(lm, segments)
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer; got {batch_size!r}")
    ids = segments.input_ids
    masks = {"first": segments.first_half[:, :-1], "second": segments.second_half[:, :-1]}
    if not bool(masks["second"].any()):
        raise InputError("these segments have no second-copy position to score")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    correct = {h: 0 for h in HALVES}
    loss = {h: 0.0 for h in HALVES}
    with torch.no_grad():
        for start in range(0, ids.shape[0], batch_size):
            chunk = ids[start:start + batch_size]
            logits = _logits(model(chunk.to(device)))[:, :-1].float().cpu()
            log_probs = logits.log_softmax(-1)  # [batch, seq - 1, vocab]
            truth = chunk[:, 1:]  # [batch, seq - 1]
            nll = -log_probs.gather(-1, truth[..., None])[..., 0]
            hits = log_probs.argmax(-1) == truth
            for half in HALVES:
                mask = masks[half][start:start + batch_size]
                correct[half] += int(hits[mask].sum())
                loss[half] += float(nll[mask].double().sum())
    rows = []
    for half in HALVES:
        n = int(masks[half].sum())
        rows.append({"half": half, "accuracy": correct[half] / n, "loss": loss[half] / n,
                     "positions": n})
    return pd.DataFrame(rows)
