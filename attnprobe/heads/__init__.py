"""What each head does: streaming census statistics, labels, syntax alignment and clusters.

- :func:`census` — every score of every head over a corpus (:mod:`.head_census`);
- :func:`classify` / :func:`summarize` — labels and summaries of stored maps (:mod:`.summary`);
- :func:`syntax` — dependency-relation accuracy of stored maps (:mod:`.dependencies`);
- label rules (:mod:`.labels`), dependency trees (:mod:`.trees`), word pooling (:mod:`.words`),
  head distances and clusters (:mod:`.similarity`), the repeated-token probe (:mod:`.probe`).
"""

from attnprobe.core.reducers import (
    REDUCERS,
    Entropy,
    KeyMass,
    MaxWeight,
    OffsetMass,
    Reducer,
    RowBlock,
    Tally,
    default_reducers,
)
from attnprobe.core.tokens import token_classes
from attnprobe.heads.census_stats import CensusStats
from attnprobe.heads.dependencies import SyntaxCounts, syntax
from attnprobe.heads.head_census import Census, census
from attnprobe.heads.labels import RULES, Thresholds, classify_scores, layer_profile
from attnprobe.heads.probe import repeated_token_scores
from attnprobe.heads.similarity import HeadDistances, cluster_heads
from attnprobe.heads.summary import classify, summarize, tally_maps
from attnprobe.heads.trees import Tree, parse, read_conllu, write_conllu
from attnprobe.heads.words import align_tokens, to_words

__all__ = [
    "REDUCERS", "RULES", "Census", "CensusStats", "Entropy", "HeadDistances", "KeyMass",
    "MaxWeight", "OffsetMass", "Reducer", "RowBlock", "SyntaxCounts", "Tally", "Thresholds",
    "Tree", "align_tokens", "census", "classify", "classify_scores", "cluster_heads",
    "default_reducers", "layer_profile", "parse", "read_conllu", "repeated_token_scores",
    "summarize", "syntax", "tally_maps", "to_words", "token_classes", "write_conllu",
]
