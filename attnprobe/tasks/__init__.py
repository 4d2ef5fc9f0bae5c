"""Synthetic tasks with known ground truth (copy, reverse, sort, ...) and their metrics."""

from attnprobe.tasks.metrics import (
    alignment_accuracy,
    alignment_error_rate,
    attention_aer,
    corpus_bleu,
    gold_mass,
    sequence_accuracy,
)
from attnprobe.tasks.synthetic import BOS, EOS, PAD, TASKS, TaskBatch, lexicon, make_batch

__all__ = ["BOS", "EOS", "PAD", "TASKS", "TaskBatch", "alignment_accuracy",
           "alignment_error_rate", "attention_aer", "corpus_bleu", "gold_mass", "lexicon",
           "make_batch", "sequence_accuracy"]
