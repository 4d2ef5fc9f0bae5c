"""Head statistics: streaming reducers (more analyses follow in later modules)."""

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

__all__ = ["REDUCERS", "Entropy", "KeyMass", "MaxWeight", "OffsetMass", "Reducer", "RowBlock",
           "Tally", "default_reducers"]
