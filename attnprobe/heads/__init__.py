"""Head statistics and the head census: streaming reducers, scores, labels, syntax, clusters.

``census`` and the repeated-token probe run models through :mod:`attnprobe.capture` (which
itself uses the reducers here), so they are imported on first use.
"""

from attnprobe._lazy import lazy_getattr
from attnprobe.heads.census_stats import CensusStats, token_classes
from attnprobe.heads.labels import PRECEDENCE, Thresholds, classify_scores, layer_profile
from attnprobe.heads.reducers import (
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
from attnprobe.heads.summary import classify, summarize, tally_maps
from attnprobe.heads.syntax import SyntaxCounts, syntax
from attnprobe.heads.trees import Tree, parse, read_conllu, write_conllu
from attnprobe.heads.words import align_tokens, to_words

_LAZY = {
    "census": "head_census",
    "Census": "head_census",
    "repeated_token_scores": "probe",
    "HeadDistances": "similarity",
    "cluster_heads": "similarity",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "PRECEDENCE", "REDUCERS", "Census", "CensusStats", "Entropy", "HeadDistances", "KeyMass",
    "MaxWeight", "OffsetMass", "Reducer", "RowBlock", "SyntaxCounts", "Tally", "Thresholds",
    "Tree",
    "align_tokens", "census", "classify", "classify_scores", "cluster_heads",
    "default_reducers", "layer_profile", "parse", "read_conllu", "repeated_token_scores",
    "summarize", "syntax", "tally_maps", "to_words", "token_classes", "write_conllu",
]
