"""Training and decoding loops for seq2seq models on synthetic tasks (used by experiments)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnprobe.tasks.metrics import corpus_bleu, sequence_accuracy
from attnprobe.tasks.synthetic import BOS, EOS, PAD, TaskBatch


def train_seq2seq(model: nn.Module, batch_at: Callable[[int], TaskBatch], *, steps: int,
                  lr: float, clip: float = 1.0, log_every: int = 50) -> list[dict]:
    """Teacher-forced Adam with cosine decay and gradient clipping, on ``batch_at(step)``.

    Returns the training curve: ``{"step", "loss"}`` with the mean loss of each
    ``log_every`` steps. The model is left in eval mode.
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    curve, window = [], []
    model.train()
    for step in range(1, steps + 1):
        batch = batch_at(step)
        logits = model(**batch.model_inputs())  # [batch, tgt, vocab]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1),
                               ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        window.append(loss.item())
        if step % log_every == 0 or step == steps:
            curve.append({"step": step, "loss": sum(window) / len(window)})
            window = []
    model.eval()
    return curve


def strip_eos(row: list[int]) -> list[int]:
    """Ids up to (excluding) the first EOS."""
    return row[: row.index(EOS)] if EOS in row else row


def decode_scores(model: nn.Module, batch: TaskBatch, *, max_new_tokens: int) -> dict[str, float]:
    """Greedy decoding of ``batch``: corpus BLEU, sequence accuracy and token accuracy."""
    with torch.no_grad():
        out = model.generate(batch.source, batch.source_mask, max_new_tokens=max_new_tokens,
                             bos_id=BOS, eos_id=EOS)
    candidates = [strip_eos(row) for row in out.tolist()]
    references = [strip_eos(row) for row in batch.labels.tolist()]
    hits = sum(sum(c == r for c, r in zip(cand, ref, strict=False))
               for cand, ref in zip(candidates, references, strict=True))
    return {"bleu": corpus_bleu(candidates, references),
            "sequence_accuracy": sequence_accuracy(candidates, references),
            "token_accuracy": hits / sum(len(r) for r in references)}
