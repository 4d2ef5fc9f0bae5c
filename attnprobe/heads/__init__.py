"""Head statistics: streaming reducers and per-head summaries."""

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
from attnprobe.heads.summary import summarize, tally_maps

__all__ = ["REDUCERS", "Entropy", "KeyMass", "MaxWeight", "OffsetMass", "Reducer", "RowBlock",
           "Tally", "default_reducers", "summarize", "tally_maps"]
