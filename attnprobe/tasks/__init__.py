"""Synthetic tasks with known ground truth (copy, reverse, sort, ...), their metrics, and the
copy tasks of the causal models (induction segments, needles in long contexts)."""

from attnprobe.tasks.induction import (
    CopyStep,
    copy_scores,
    copy_steps,
    copy_task,
    held_out,
    prefix_text,
)
from attnprobe.tasks.metrics import (
    alignment_accuracy,
    alignment_error_rate,
    attention_aer,
    corpus_bleu,
    gold_mass,
    sequence_accuracy,
)
from attnprobe.tasks.needle import Needles, greedy_continuation, needle_task
from attnprobe.tasks.synthetic import (
    ALIGNMENT_TASKS,
    BOS,
    EOS,
    PAD,
    TaskBatch,
    lexicon,
    make_batch,
)

__all__ = ["ALIGNMENT_TASKS", "BOS", "EOS", "PAD", "CopyStep", "Needles", "TaskBatch",
           "alignment_accuracy", "alignment_error_rate", "attention_aer", "copy_scores",
           "copy_steps", "copy_task", "corpus_bleu", "gold_mass", "greedy_continuation", "held_out",
           "lexicon", "make_batch", "needle_task", "prefix_text", "sequence_accuracy"]
