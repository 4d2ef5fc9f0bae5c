"""Reading a model's weights: per-head attention weights and norms in one convention
(:mod:`~attnprobe.weights.head_weights`) and where a model keeps the pieces of its residual
stream (:mod:`~attnprobe.weights.anatomy`), for logit attribution and the QK/OV circuits."""
