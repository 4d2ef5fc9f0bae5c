"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"): the heads that copy a needle from a long context into the output.

**Copy steps** (:mod:`attnprobe.heads.copy_steps`). A copy step is a query position ``i``
whose next token ``w`` is read from earlier in the context: from a *source* span (the
needle), named by a task or found in plain texts.

**Retrieval score** of a head: the share of copy steps at which the head's top-attended key
(the argmax of row ``i``) lies in the source span *and* holds ``w`` — Wu et al.'s criterion,
where a head "copies and pastes" a needle token. With ``copied_only=True`` a step counts only
when the model itself predicts ``w`` there (Wu et al. score greedy generations); the
denominator stays every copy step, as their score divides by the needle's length.

The score is a streaming reducer (:class:`RetrievalHits`, sums and counts per head): the
capture hands it blocks of query rows, so long contexts are never held as whole
``[query, key]`` matrices, and per-batch tallies merge exactly across processes. The table
has the census' index columns (``stack, kind, layer, head, head_id``), so it joins the census'
``scores()`` and the label rules can read its ``retrieval`` column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture.context import capture
from attnprobe.capture.info import model_scope
from attnprobe.capture.parts import Reduce
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.display import counted, describe
from attnprobe.core.distributed import run_sharded
from attnprobe.core.reducers import REDUCERS, Sums, Tally
from attnprobe.core.residence import input_device
from attnprobe.core.row_blocks import RowBlock
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.heads.copy_steps import CopySteps, CopyTask, as_copy_steps
from attnprobe.inputs.text import (
    DEFAULT_BATCH_SIZE,
    Truncation,
)

__all__ = ["ACCURACY_COLUMNS", "COLUMNS", "RetrievalHits", "copy_accuracy", "retrieval_scores"]

COLUMNS = ["stack", "kind", "layer", "head", "head_id", "retrieval", "copy_steps"]
ACCURACY_COLUMNS = ["example", "copy_steps", "correct", "accuracy"]


@REDUCERS.register("retrieval")
@dataclass(frozen=True, eq=False)
class RetrievalHits:
    """Streaming retrieval hits of one batch (see the module docstring).

    Args:
        target: ``[batch, seq]`` long, the token copied after each position (-1: no step),
            indexed by position among the real tokens.
        source: ``[batch, seq]`` bool, the positions copies are read from.
        copied: ``[batch, seq]`` bool, the steps at which the model itself produced the
            target (``None``: every step may score).

    Returns per block ``{"retrieval": (hits [head], copy steps [head])}``.
    """

    target: torch.Tensor
    source: torch.Tensor
    copied: torch.Tensor | None = None
    name: str = "retrieval"

    def __repr__(self) -> str:
        return describe("RetrievalHits", f"{counted(self.target.shape[0], 'example')} × "
                        f"{counted(self.target.shape[1], 'position')}",
                        counted(int((self.target >= 0).sum()), "copy step"),
                        "steps the model copied" if self.copied is not None else None)

    def __call__(self, block: RowBlock) -> dict[str, Sums]:
        if block.key_ids is None:
            block.require_ids("retrieval")
        a = block.pattern  # [batch, head, q_block, key]
        device = a.device
        batch, n_heads, q_block, _ = a.shape
        width = self.target.shape[1]
        q_pos = block.query_pos.to(device).clamp(0, width - 1)  # [batch, q_block]
        target = self.target.to(device).gather(1, q_pos)
        step = (target >= 0) & block.query_valid.to(device)  # [batch, q_block]
        scoring = step if self.copied is None else \
            step & self.copied.to(device).gather(1, q_pos)
        top = a.argmax(-1).reshape(batch, n_heads * q_block)  # key column of each row's max
        key_pos = block.key_pos.to(device).gather(1, top)  # -1 on padding keys
        key_token = block.key_ids.to(device).gather(1, top)
        in_source = self.source.to(device).gather(1, key_pos.clamp(0, width - 1)) & \
            (key_pos >= 0)
        hit = (key_token == target.repeat(1, n_heads)) & in_source  # [batch, head * q_block]
        hit = hit.view(batch, n_heads, q_block) & scoring[:, None, :]
        hits = hit.sum(dim=(0, 2), dtype=torch.float64)
        steps = step.sum(dtype=torch.float64).expand(n_heads)
        return {self.name: (hits.cpu(), steps.cpu())}


def _logits(output: Any) -> torch.Tensor:
    """``[batch, seq, vocab]`` next-token logits of a model's output."""
    logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise InputError("copy accuracy and copied_only need next-token logits: give a "
                         "language model (e.g. a transformers ...ForCausalLM, ref:induction)")
    return logits


def _inputs(model: nn.Module, batch: CopySteps) -> dict[str, torch.Tensor]:
    device = input_device(model)
    return {"input_ids": batch.input_ids.to(device),
            "attention_mask": batch.attention_mask.to(device)}


def _predicted(model: nn.Module, batch: CopySteps) -> torch.Tensor:
    """``[batch, seq]`` bool: the model's greedy next token is the target (copy steps only)."""
    with torch.no_grad():
        predicted = _logits(model(**_inputs(model, batch))).argmax(-1).cpu()
    return (predicted == batch.target) & (batch.target >= 0)


def _retrieval_batch(model: nn.Module, scope: Scope, copied_only: bool,
                     batch: CopySteps) -> Tally:
    copied = _predicted(model, batch) if copied_only else None
    reducer = RetrievalHits(batch.target, batch.source, copied)
    with torch.no_grad(), capture(model, scope, parts=[Reduce([reducer])],
                                  stop_early=True) as cap:
        model(**_inputs(model, batch))  # stops after the last scoped attention layer
    return cap.tally


def retrieval_scores(model: nn.Module, tokenizer: Any, texts: Sequence[str] | CopyTask, *,
                     min_match: int = 4, copied_only: bool = False,
                     corpus: CorpusOptions | None = None, **keywords: Any) -> pd.DataFrame:
    """The retrieval score of every head in ``scope`` over the copy steps of ``texts``.

    Args:
        texts: texts (strings or token ids, as every corpus analysis takes them), whose
            copy steps are found by :func:`find_copy_steps` (``min_match``
            tokens), or a :class:`CopyTask` that names them (e.g.
            :func:`attnprobe.tasks.needle.needle_task`).
        copied_only: count a head's hit only where the model's greedy next token is the
            copied one (Wu et al.; one extra forward per batch for the logits).
        corpus / keywords: the corpus options (:class:`~attnprobe.core.corpus_options.
            CorpusOptions`, or its fields by name): ``scope``; ``batch_size``, examples per
            forward; ``truncation``, ``"error"`` (an example longer than the model's
            positions is a one-line error) or ``"skip"`` (left out; listed in
            ``frame.attrs["skipped"]``); ``progress``; ``distributed``, split batches over
            an initialised ``torch.distributed`` group; ``seed`` is unused (nothing is
            drawn). ``max_length`` is refused: the copy steps run whole.

    Returns:
        One row per head (:data:`COLUMNS`): ``retrieval`` in [0, 1] and ``copy_steps``, the
        number of steps it is a share of; ``attrs["skipped"]`` lists examples left out.

    Example:
        >>> from attnprobe.tasks import needle_task
        >>> task = needle_task(4, length=64, depth=0.5)  # needles of 16, 2 given: 14 steps
        >>> scores = retrieval_scores(lm, lm_tok, task)  # a causal LM: ref:induction
        >>> len(scores), int(scores["copy_steps"].iloc[0])   # 2 × 4 heads; 4 × 14 steps
        (8, 56)
        >>> scores.query("retrieval > 0.1")             # the copying heads
    """
    walk = CorpusOptions.merged(corpus, keywords, owner="retrieval_scores()")
    if walk.max_length is not None:  # a cut copy step would score a different task
        raise InputError("retrieval_scores takes no max_length: copy steps run whole "
                         "(truncation='skip' leaves the long examples out)")
    scope = model_scope(model, walk.scope)
    steps = as_copy_steps(model, tokenizer, texts, truncation=walk.truncation,
                          min_match=min_match)
    parts = run_sharded(partial(_retrieval_batch, model, scope, bool(copied_only)),
                        steps.batches(walk.batch()), distributed=walk.distributed,
                        progress=walk.progress, desc="retrieval")
    tally = Tally()
    for part in parts:  # in batch order, whatever the number of ranks
        tally = tally + part
    frame = tally.to_frame()
    frame = frame[frame["statistic"] == "retrieval"]
    table = frame.rename(columns={"value": "retrieval", "count": "copy_steps"})[COLUMNS]
    table = table.assign(copy_steps=table["copy_steps"].astype(int)).reset_index(drop=True)
    table.attrs["skipped"] = steps.skipped
    return table


def copy_accuracy(model: nn.Module, tokenizer: Any, texts: Sequence[str] | CopyTask, *,
                  batch_size: int = DEFAULT_BATCH_SIZE, truncation: Truncation = "error",
                  min_match: int = 4) -> pd.DataFrame:
    """How often the model's greedy next token is the copied one, per example (``texts``
    and the options as in :func:`retrieval_scores`): one teacher-forced forward, the argmax
    of the logits at each copy step against its target.

    Run it inside :func:`attnprobe.perturb.perturbed` to see what ablating heads costs.

    Which positions count depends on the input. In texts the copy steps are found by
    :func:`find_copy_steps`: only where the last ``min_match`` (4) tokens occurred earlier,
    so the first ``min_match - 1`` positions of a repeated segment — where the copy is
    hardest to find — are usually no steps. A task names its steps. So on
    ``ref:induction``'s held-out texts it reads higher than
    :func:`attnprobe.tasks.induction.copy_scores`, which scores every position of the second
    copy; on :func:`attnprobe.tasks.induction.copy_task` the two agree (pool this table as
    ``correct.sum() / copy_steps.sum()``; the mean of ``accuracy`` weighs every example
    alike).

    Returns:
        One row per example (:data:`ACCURACY_COLUMNS`): ``copy_steps``, ``correct`` and
        their ratio ``accuracy``.

    Example:
        >>> acc = copy_accuracy(lm, lm_tok, [prompt])   # [BOS], 8 tokens, the same 8 again
        >>> acc.columns.tolist()
        ['example', 'copy_steps', 'correct', 'accuracy']
        >>> int(acc["copy_steps"][0])   # 4 tokens matched at positions 12-15 (16 is the last)
        4
        >>> with ap.perturb.perturbed(lm, "zero", scope="layer:1"):    # the cost of ablating
        ...     ablated = copy_accuracy(lm, lm_tok, [prompt])
    """
    steps = as_copy_steps(model, tokenizer, texts, truncation=truncation, min_match=min_match)
    rows = {}
    for batch in steps.batches(batch_size):
        correct = _predicted(model, batch).sum(-1)
        n = (batch.target >= 0).sum(-1)
        for example, c, k in zip(batch.ids, correct.tolist(), n.tolist(), strict=True):
            if k:
                rows[example] = (example, k, c, c / k)
    return pd.DataFrame([rows[i] for i in steps.ids if i in rows], columns=ACCURACY_COLUMNS)
