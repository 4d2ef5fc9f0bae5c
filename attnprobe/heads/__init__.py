"""What each head does: streaming census statistics, labels, syntax alignment and clusters.

- :func:`census` — every score of every head over a corpus (:mod:`.head_census`);
- :func:`classify` / :func:`summarize` — labels and summaries of stored maps (:mod:`.summary`);
- :func:`syntax` — dependency-relation accuracy of stored maps (:mod:`.dependencies`);
- label rules with their families (:mod:`.labels`, :mod:`.label_rules`, :mod:`.label_tables`),
  sink keys and sink-free scores (:mod:`.sinks`), dependency trees (:mod:`.trees`), word pooling
  (:mod:`.words`), head distances and clusters (:mod:`.similarity`), the repeated-token probe
  (:mod:`.probe`);
- :func:`retrieval_scores` / :func:`copy_accuracy` — retrieval heads on copy tasks
  (:mod:`.retrieval`);
- :func:`diff` — what changed between two checkpoints (:mod:`.checkpoint_diff`,
  :mod:`.paired_attention`).
"""

from attnprobe.core.reducers import REDUCERS, KeyMass, Reducer, Tally, default_reducers
from attnprobe.core.row_blocks import RowBlock
from attnprobe.core.tokens import token_classes
from attnprobe.heads.census_options import CensusOptions
from attnprobe.heads.census_stats import CensusStats
from attnprobe.heads.checkpoint_diff import Diff, diff, diff_censuses
from attnprobe.heads.copy_steps import CopySteps, find_copy_steps
from attnprobe.heads.dependencies import SyntaxCounts, syntax
from attnprobe.heads.direct_logits import LogitAttribution, logit_attribution
from attnprobe.heads.head_census import Census, census
from attnprobe.heads.head_composition import Composition, composition
from attnprobe.heads.labels import (
    RULES,
    Thresholds,
    classify_scores,
    label_counts,
    layer_profile,
)
from attnprobe.heads.paired_attention import AttentionChange, attention_change
from attnprobe.heads.probe import repeated_token_scores
from attnprobe.heads.qk_ov import Circuits, Factored, circuits
from attnprobe.heads.retrieval import RetrievalHits, copy_accuracy, retrieval_scores
from attnprobe.heads.similarity import HeadDistances, cluster_heads
from attnprobe.heads.sinks import SinkRule
from attnprobe.heads.stat_views import Entropy, MaxWeight, OffsetMass
from attnprobe.heads.summary import classify, summarize, tally_maps
from attnprobe.heads.trees import Tree, parse, read_conllu, write_conllu
from attnprobe.heads.words import align_tokens, to_words

__all__ = [
    "REDUCERS", "RULES", "AttentionChange", "Census", "CensusOptions", "CensusStats",
    "Circuits", "Composition", "CopySteps", "Diff", "Entropy", "Factored", "HeadDistances",
    "KeyMass", "LogitAttribution", "MaxWeight", "OffsetMass", "Reducer", "RetrievalHits",
    "RowBlock", "SinkRule", "SyntaxCounts", "Tally", "Thresholds", "Tree", "align_tokens",
    "attention_change", "census", "circuits", "classify", "classify_scores", "cluster_heads",
    "composition", "copy_accuracy", "default_reducers", "diff", "diff_censuses",
    "find_copy_steps", "label_counts", "layer_profile", "logit_attribution", "parse",
    "read_conllu", "repeated_token_scores", "retrieval_scores", "summarize", "syntax",
    "tally_maps", "to_words", "token_classes", "write_conllu",
]
